"""The report in a real browser: index.html rendered in headless Chromium must show every image and
log no console error; every figure is captioned; the figures the issue asks for are there; making
the report raises no library warnings."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import warnings

import numpy as np
import pytest

from tasks.report import _scatter, make_report
from tests.browser import chromium, render
from tests.results_store import build_store

GRID = {"k": [6, 9], "latent_dim": [1, 2], "seed": [0, 1]}


@contextlib.contextmanager
def no_library_warnings():
    """Fail on a Python warning or a warning logged by matplotlib (its 'Ignoring fixed x limits'
    messages are log records, not warnings)."""
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger("matplotlib")
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            yield records
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage() for r in records] == []


def _need_chromium():
    if chromium() is None:
        if os.environ.get("CI"):
            pytest.fail(
                "CI is set but chromium is missing: .ci/run installs it (apt-get install -y chromium)"
            )
        pytest.skip("chromium is not installed (apt-get install -y chromium); CI installs it")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    store = tmp_path_factory.mktemp("report") / "roll.zarr"
    build_store(
        store,
        {"name": "swiss_roll", "n": 150, "seed": 3},
        ["ppca", "glle_em", "bgplvm_linear"],
        GRID,
        {"bgplvm": {"max_iter": 30, "n_inducing": 10}},
    )
    with no_library_warnings():  # no library warning spam (matplotlib, numpy, xarray)
        index = make_report(store)
    return store, index


@pytest.mark.slow  # builds the module's store (12 + 4 + 4 fits) and renders it
def test_report_renders_in_chromium_with_every_image_and_no_console_error(report, tmp_path):
    _need_chromium()
    store, index = report
    html = open(index).read()
    srcs = re.findall(r"<img src='([^']+)'", html)
    for want in (
        "embeddings.png",
        "heatmap_glle_em.png",
        "curves_glle_em_k.png",
        "curves_glle_em_latent_dim.png",
        "curves_bgplvm_linear_latent_dim.png",
        "generations_glle_em.png",
        "ard_bgplvm_linear.png",
    ):
        assert want in srcs, (want, srcs)
    # every figure has a caption that says what it shows and the setting
    figures = re.findall(r"<figure>(.*?)</figure>", html, re.S)
    assert len(figures) == len(srcs)
    for fig in figures:
        caption = re.search(r"<figcaption>(.+?)</figcaption>", fig, re.S)
        assert caption and ("=" in caption.group(1) or "setting" in caption.group(1)), fig
    assert "Red ellipses: one posterior standard deviation (embedding_var) of 40 points" in html
    assert "points (ppca, bgplvm_linear)." in html  # the models with posterior variances
    assert "chosen by" in html and "geodesic_agreement across k, latent_dim" in html

    seen = render(f"file://{index}", screenshot=tmp_path / "report.png")
    assert seen["errors"] == [] and seen["failed"] == [] and seen["broken_images"] == [], seen
    assert seen["images"] == len(srcs) and seen["title"] == "embed-sweep report"
    assert (tmp_path / "report.png").stat().st_size > 50_000

    # the same check fails on a missing image and on a script error
    broken = tmp_path / "broken"
    shutil.copytree(os.path.dirname(index), broken)
    (broken / "heatmap_glle_em.png").unlink()
    page = (
        (broken / "index.html").read_text().replace("</body>", "<script>no_such_function()</script></body>")
    )
    (broken / "index.html").write_text(page)
    bad = render(f"file://{broken / 'index.html'}")
    assert bad["broken_images"] == [f"file://{broken / 'heatmap_glle_em.png'}"]
    assert any("no_such_function is not defined" in e for e in bad["errors"])
    assert any("ERR_FILE_NOT_FOUND" in e for e in bad["errors"]) and bad["failed"]


def test_heat_map_marks_the_chosen_setting_of_a_two_dimensional_grid(report):
    from embed_sweep import select

    store, index = report
    chosen = select(store, "glle_em")["setting"]
    html = open(index).read()
    assert f"the star marks the chosen setting (k={chosen['k']}, latent_dim={chosen['latent_dim']}" in html


def test_poincare_disc_panel_raises_no_matplotlib_warning():
    """The hGP-LVM panels fix the limits to the unit disc: an equal aspect must adapt the box, not
    the limits (matplotlib warned 'Ignoring fixed x limits' 24 times in the main job before)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rng = np.random.default_rng(0)
    X = rng.uniform(-0.6, 0.6, (50, 2))
    fig, ax = plt.subplots(figsize=(3, 2))
    with no_library_warnings():
        _scatter(ax, X, rng.random(50), "hgplvm", True)
        fig.canvas.draw()
        fig.tight_layout()
    assert ax.get_xlim() == (-1.05, 1.05) and ax.get_ylim() == (-1.05, 1.05)
    # and a Euclidean panel with posterior ellipses keeps the points' limits, also without warnings
    fig2, ax2 = plt.subplots(figsize=(3, 2))
    with no_library_warnings():
        _scatter(ax2, 10 * X, None, "bgplvm", False, var=np.full((50, 2), 400.0))
        fig2.canvas.draw()
    assert ax2.get_xlim()[1] < 10  # the 20-unit ellipses did not widen the view
    plt.close(fig)
    plt.close(fig2)


def recording_subplots(monkeypatch):
    """Every (figure, axes) the report makes, kept after it closes them: what a test reads the
    drawn lines and legends from."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    real = plt.subplots

    def subplots(*args, **kwargs):
        fig, axes = real(*args, **kwargs)
        made.append((fig, axes))
        return fig, axes

    monkeypatch.setattr(plt, "subplots", subplots)
    return made


def test_curves_follow_the_grid_values_not_the_storage_order_of_a_grown_store(tmp_path, monkeypatch):
    """A store grown from k = 8 by k = 6 and 10 holds k in the order 8, 6, 10; every curve against
    k must run 6 -> 8 -> 10 with each point's own values (issue 36, W9: the lines zig-zagged)."""
    from embed_sweep import open_store

    store = tmp_path / "grown.zarr"
    data = {"name": "swiss_roll", "n": 120, "seed": 2}
    build_store(store, data, ["glle_em"], {"k": [8], "latent_dim": [2], "seed": [0]}, n_generations=0)
    build_store(store, data, ["glle_em"], {"k": [8, 6, 10], "latent_dim": [2], "seed": [0]}, n_generations=0)
    ds = open_store(store)["glle_em"].ds
    assert ds["k"].values.tolist() == [8, 6, 10]  # the storage order the report must not follow
    made = recording_subplots(monkeypatch)
    with no_library_warnings():
        make_report(store, tmp_path / "report")
    curves = [ax for _, axes in made for ax in np.ravel(axes) if ax.get_xlabel() == "k"]
    assert {ax.get_title() for ax in curves} >= {"elbo", "trustworthiness", "geodesic agreement"}
    for ax in curves:
        line = ax.get_lines()[-1]  # the mean over seeds, drawn "o-" after the single-seed dots
        assert line.get_xdata().tolist() == [6, 8, 10], ax.get_title()
        name = ax.get_title().replace(" ", "_")
        if name in ds:
            want = [float(ds[name].sel(k=k, latent_dim=2, seed=0)) for k in (6, 8, 10)]
            np.testing.assert_allclose(line.get_ydata(), want, rtol=1e-12, err_msg=name)
