"""The report's notes on how the chosen setting of a graph model was fitted: a neighbour graph in
several connected components is laid out arbitrarily (issue 52 item 4), said once per model."""

from __future__ import annotations

import numpy as np
import xarray as xr

from tasks.report import components_notes


def _group(counts):
    """A model group over k = 10, 15 and seeds 0, 1 with ``n_components_graph`` per point."""
    return xr.Dataset(
        {"n_components_graph": (("k", "seed"), np.asarray(counts, dtype=np.float64))},
        coords={"k": [10, 15], "seed": [0, 1]},
    )


def test_the_chosen_setting_in_pieces_is_named_with_its_count_and_others_are_not():
    groups = [("glle_em", _group([[3, 3], [1, 1]])), ("lllvm", _group([[2, 2], [1, 1]]))]
    chosen = {"glle_em": {"setting": {"k": 10, "seed": 1}}, "lllvm": {"setting": {"k": 15, "seed": 0}}}
    (line,) = components_notes(groups, chosen)
    assert line.startswith("glle_em: at the chosen setting (k=10, seed=1)")
    assert "3 connected components" in line and "arbitrary" in line


def test_no_note_without_the_count_a_choice_or_a_finished_point():
    plain = xr.Dataset({"elbo": (("seed",), [1.0])}, coords={"seed": [0]})
    groups = [("ppca", plain), ("glle_em", _group([[np.nan, 1], [1, 1]]))]
    chosen = {"ppca": {"setting": {"seed": 0}}, "glle_em": {"setting": {"k": 10, "seed": 0}}}
    assert components_notes(groups, chosen) == []
    assert components_notes([("glle_em", _group([[4, 4], [4, 4]]))], {"glle_em": {"setting": None}}) == []
