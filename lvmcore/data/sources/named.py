"""Named data sets: the seeded generators (:mod:`lvmcore.data.synthetic`) and scikit-learn's
bundled digits, by name with their options, as sources over the drawn arrays.

A named data set is known by its recipe (:func:`recipe`: the name, every option with its default,
:data:`GENERATOR_VERSION` and the versions of the libraries that draw it) before it is drawn: a
sweep plans from :func:`recipe_fingerprint` and :func:`describe_named` (a small probe), and the
worker that ingests draws it.
"""

from __future__ import annotations

import hashlib
import inspect
import json

import numpy as np

from lvmcore.checks import check_options
from lvmcore.data import synthetic
from lvmcore.data.sources.base import Source, array_source, dataset_attrs

__all__ = [
    "GENERATOR_VERSION",
    "DATASETS",
    "list_datasets",
    "recipe",
    "recipe_fingerprint",
    "named_source",
    "describe_named",
    "check_named_options",
    "load_attrs",
]

#: the version of the named generators' recipes: change it when a generator draws other data for
#: the same options (a store ingested from the old recipe is then rebuilt, a result store refused)
GENERATOR_VERSION = "2026-11-24.1"


def _gen_manifold(fn, default_n, color_col=0):
    def make(n=default_n, seed=0):
        Y, lat = fn(n, seed)[:2]
        return dict(Y=Y, truth=lat, color=lat[:, color_col])

    return make


def _lllvm_roll(n=400, seed=0):
    Y, lat, iso = synthetic.lllvm_swiss_roll(n, seed)
    return dict(Y=Y, truth=iso, color=lat[:, 0])


def _tree(depth=4, n_per_node=20, seed=0):
    Y, node, codes, depth_label = synthetic.binary_tree(depth, n_per_node, seed)
    return dict(Y=Y, truth=codes[node], truth_metric="cityblock", label=depth_label, color=depth_label)


def _mrd_toy(n=100, seed=0, noise=0.1):
    views, signals = synthetic.mrd_toy(n, seed, noise)
    return dict(Y=np.hstack(views), views=views, truth=signals, color=np.linspace(0, 4 * np.pi, n))


def _digits(classes=5, n_per_class=None, seed=0):
    """scikit-learn's bundled 8x8 digits (no download); the first ``classes`` digit classes,
    optionally ``n_per_class`` drawn per class with ``seed``."""
    from sklearn.datasets import load_digits  # scikit-learn is heavy: imported for this set only

    if not 2 <= int(classes) <= 10:
        raise ValueError(f"digits: classes must be in 2..10, got {classes}")
    d = load_digits()
    keep = np.flatnonzero(d.target < int(classes))
    if n_per_class is not None:
        rng = np.random.default_rng(seed)
        keep = np.concatenate(
            [
                rng.choice(np.flatnonzero(d.target == c), size=int(n_per_class), replace=False)
                for c in range(int(classes))
            ]
        )
        keep.sort()
    return dict(Y=d.data[keep] / 16.0, label=d.target[keep], color=d.target[keep])


#: name -> (maker, description)
DATASETS = {
    "swiss_roll": (_gen_manifold(synthetic.swiss_roll, 1000), "scikit-learn Swiss roll (paper 001); n, seed"),
    "lllvm_swiss_roll": (_lllvm_roll, "LL-LVM authors' Swiss roll (papers 000/003); n, seed"),
    "s_curve": (_gen_manifold(synthetic.s_curve, 1000), "scikit-learn S-curve (paper 001); n, seed"),
    "swiss_hole": (_gen_manifold(synthetic.swiss_hole, 1000), "Swiss roll with a hole (paper 001); n, seed"),
    "severed_bowl": (_gen_manifold(synthetic.severed_bowl, 1000), "severed bowl (paper 001); n, seed"),
    "gaussian_blob": (_gen_manifold(synthetic.gaussian_blob, 800), "3-D Gaussian bump (paper 000); n, seed"),
    "binary_tree": (_tree, "synthetic binary tree (paper 002); depth, n_per_node, seed"),
    "mrd_toy": (_mrd_toy, "two-view sine/cosine toy (paper 004); n, seed, noise"),
    "digits": (_digits, "scikit-learn 8x8 digits, bundled; classes, n_per_class, seed"),
}


def list_datasets() -> dict[str, str]:
    """Names that :func:`load` accepts, with a one-line description each."""
    return {k: v[1] for k, v in DATASETS.items()}


def _maker_params(name: str, options: dict) -> dict:
    """Every option of the named generator ``name``, defaults filled in (ValueError for options it
    does not take): ``{"n": 1000}`` and ``{"n": 1000, "seed": 0}`` draw the same data."""
    sig = inspect.signature(DATASETS[name][0])
    try:
        bound = sig.bind(**options)
    except TypeError as e:
        raise ValueError(f"bad options {options} for data set {name!r}: {e}") from e
    bound.apply_defaults()
    return dict(bound.arguments)


def recipe(name: str, **options) -> dict:
    """The canonical recipe of a named data set: its name, every generator option (defaults filled
    in), :data:`GENERATOR_VERSION` and the versions of the libraries that draw it (NumPy's bit
    generators, scikit-learn's sheets). Equal recipes draw equal data."""
    import sklearn  # for its version only; the package itself is heavy to import

    if name not in DATASETS:
        raise ValueError(f"{name!r} is not a named data set; known names: {', '.join(DATASETS)}")
    params = json.loads(json.dumps(_maker_params(name, options), sort_keys=True, default=str))
    return {
        "name": name,
        "params": params,
        "generator_version": GENERATOR_VERSION,
        "numpy": np.__version__,
        "scikit-learn": sklearn.__version__,
    }


def recipe_fingerprint(name: str, **options) -> str:
    """The fingerprint of a named data set: a hash of its :func:`recipe`, known without drawing
    the data (a sweep plans from it; the worker that ingests draws the data). The store records
    it as its ``fingerprint`` beside the drawn data's ``content_fingerprint``."""
    blob = json.dumps(recipe(name, **options), sort_keys=True).encode()
    return "recipe-" + hashlib.sha256(blob).hexdigest()[:25]


#: the option that sets a named generator's number of rows, and the value a probe draws with
_ROWS_OPTION = {"n": 16, "n_per_node": 1}


def describe_named(name: str, options: dict) -> dict:
    """:func:`describe` of a named data set without drawing it: the generator runs at a probe size
    (16 rows, or one sample per tree node) for the variables, dimensions and attributes, and the
    row count is scaled to the asked size (every generator here draws exactly ``n`` rows, or
    ``n_per_node`` per node). Options it cannot take are refused as :func:`load` refuses them."""
    params = _maker_params(name, options)  # ValueError for an option the generator lacks
    probe = dict(options)
    for opt, small in _ROWS_OPTION.items():
        value = params.get(opt)
        if (
            opt in params
            and isinstance(value, (int, np.integer))
            and not isinstance(value, bool)
            and value > small
        ):
            probe[opt] = small
            ds = named_source(name, probe)
            rows = ds.sizes()["point"] // small * int(value)
            break
    else:  # a small or an invalid size: draw it (small), or let the generator refuse it
        ds = named_source(name, options)
        rows = ds.sizes()["point"]
    attrs = dict(ds.attrs)
    attrs.update({k: v for k, v in load_attrs(name, options).items() if k in ("params", "seed")})
    return {
        "sizes": {**ds.sizes(), "point": rows},
        "attrs": attrs,
        "fingerprint": recipe_fingerprint(name, **options),
    }


def load_attrs(name: str, options: dict) -> dict:
    """The ``params`` and ``seed`` attributes :func:`load` gives the named data set ``name``."""
    maker = DATASETS[name][0]
    params = dict(options)
    params.setdefault("seed", 0 if "seed" in maker.__code__.co_varnames else None)
    return dataset_attrs(name=name, source=f"generator:{name}", params=params)


def check_named_options(name: str, options: dict) -> None:
    """Unknown options of a named data set refused (naming them and the accepted ones), and the
    limits of the bundled sets checked against the options."""
    check_options(options, inspect.signature(DATASETS[name][0]).parameters, f"data-set ({name})")
    if name == "digits" and options.get("n_per_class") is not None:
        from sklearn.datasets import load_digits  # scikit-learn is heavy: imported for this set only

        classes = options.get("classes", 5)
        n = options["n_per_class"]
        if isinstance(classes, int) and 2 <= classes <= 10 and isinstance(n, int) and not isinstance(n, bool):
            counts = np.bincount(load_digits().target)[:classes]
            if n > counts.min() or n < 1:
                raise ValueError(
                    f"digits: n_per_class = {n} is out of range: the first {classes} classes have "
                    f"{counts.min()} to {counts.max()} samples each, so n_per_class must be 1 .. "
                    f"{counts.min()}; lower n_per_class (or leave it out for every sample)"
                )


def named_source(name: str, options: dict) -> Source:
    """The named data set ``name`` drawn with ``options`` (refused naming the options it takes),
    as a source over the drawn arrays."""
    maker = DATASETS[name][0]
    check_named_options(name, options)
    try:
        parts = maker(**options)
    except TypeError as e:
        raise ValueError(f"bad options {options} for data set {name!r}: {e}") from e
    params = dict(options)
    params.setdefault("seed", 0 if "seed" in maker.__code__.co_varnames else None)
    return _drawn(name=name, source=f"generator:{name}", params=params, **parts)


def _drawn(
    *, name, source, params, Y, label=None, color=None, truth=None, truth_metric="euclidean", views=None
) -> Source:
    data = {"Y": (("point", "feature"), np.asarray(Y, dtype=np.float64))}
    if views is not None:
        for v, Yv in enumerate(views):
            data[f"view_{v}"] = (("point", f"feature_{v}"), np.asarray(Yv, dtype=np.float64))
    if label is not None:
        data["label"] = (("point",), np.asarray(label, dtype=np.int64))
    if color is not None:
        data["color"] = (("point",), np.asarray(color, dtype=np.float64))
    if truth is not None:
        data["truth"] = (("point", "truth_dim"), np.asarray(truth, dtype=np.float64))
    attrs = dataset_attrs(
        name=name,
        source=source,
        params=params,
        truth_metric=truth_metric,
        n_views=len(views) if views is not None else 0,
    )
    return array_source(name, data, attrs)
