"""Graph models on a neighbour graph in several pieces (issue 52 item 4).

An atlas's kNN graph often falls apart into connected components (a cell type unlike the rest).
LLE's eigenproblem and LL-LVM's graph prior are then not defined on the whole graph (the null
space of M = (I - W)^T (I - W), or of the Laplacian, has one dimension per component), but each
component is a well-posed problem of its own. A graph model decorated with :func:`by_component`
(GLLE, LL-LVM) therefore:

- finds the connected components of the symmetrised (union) neighbour graph of its fit;
- with one component, runs its own ``fit`` unchanged (the same numbers, bit for bit);
- with several, fits each component as its own problem: a clone of the estimator (same
  parameters, same ``random_state``) on the component's rows and the graph restricted to them,
  so each component's model is exactly a fit of that component alone. A component smaller than
  ``n_neighbors + 1`` points is refused, naming its size;
- combines them: the embedding's rows in the original order; the criterion ``elbo_`` (GLLE's
  log-likelihood, LL-LVM's bound) the sum over components, since the fits are independent models
  of disjoint rows (their joint density is the product); ``elbo_trace_`` the sum of the
  components' traces, a component that stopped earlier held at its final value (``n_iter_`` the
  longest, ``converged_`` only if every component converged);
- places the components in one layout that is ARBITRARY (as UMAP lays out its components):
  the relative position, scale and orientation of two components mean nothing. Component c's
  embedding is centred (``component_centres_[c]``), divided by its root mean square radius
  (``component_scales_[c]``) and moved to ``component_offsets_[c]``, points of a grid in the first
  two latent axes (a line when Q = 1) with spacing ``SPACING`` times the largest placed radius, so
  no two components overlap. Variances are divided by the component's scale squared (the same
  affine map). ``n_components_graph_`` is the count, ``layout_arbitrary_`` says the layout is
  arbitrary (False with one component), ``graph_labels_`` (N,) each row's component (numbered
  by their first row).

New points (``transform``, ``score_samples``, ``mapping_score``) go to the component most of their
``n_neighbors`` nearest training rows belong to (ties: the one of the nearest such row) and are
answered by that component's model, placed by its map, so each point stays its own problem. GLLE's
``sample`` draws each component's generations and places them by the same map; LL-LVM's
``inverse_transform`` takes a latent point to the component of its nearest placed training latent.

Persistence: ``to_arrays`` keeps the combined embedding, the placement and each component's own
``to_arrays`` (arrays under ``component<i>.<name>``, fitted scalars under
``params["fitted"]["components_fitted"][str(i)]``); ``from_arrays`` rebuilds each component's model
from them and the store's data and graph restricted to the component.
"""

from __future__ import annotations

from functools import wraps

import numpy as np
from sklearn.base import clone

from lvmcore.checks import check_data, check_graph
from lvmcore.graph import adjacency, connected_components, knn, knn_query
from lvmcore.models._base import MODEL_FORMAT

__all__ = [
    "SPACING",
    "by_component",
    "component_labels",
    "check_component_sizes",
    "placement",
    "place",
    "unplace",
    "neighbour_index_graph",
]

#: component centres are at least this times the largest placed radius apart (> 2: no overlap)
SPACING = 2.5
#: prefix of a component's arrays in ``to_arrays``
_PREFIX = "component{}."
#: the methods :func:`by_component` dispatches to the components' models, where the class has them
_DISPATCHED = (
    "transform",
    "score_samples",
    "reference_score_stats",
    "mapping_score",
    "to_arrays",
    "_restore",
    "sample",
    "sample_weights",
    "inverse_transform",
)


# --------------------------------------------------------------------------- graph and layout
def component_labels(W) -> tuple[int, np.ndarray]:
    """(number of components, (N,) int64 label of each row) of a symmetric adjacency, components
    numbered in the order of their first row."""
    n_comp, lab = connected_components(W)
    first = np.full(n_comp, len(lab), dtype=np.int64)
    np.minimum.at(first, lab, np.arange(len(lab)))
    rank = np.empty(n_comp, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(n_comp)
    return int(n_comp), rank[lab].astype(np.int64)


def check_component_sizes(labels, k: int) -> None:
    """Refuse a component smaller than k + 1 points (a point's k neighbours plus itself), with its
    size and the fix."""
    sizes = np.bincount(labels)
    small = np.flatnonzero(sizes < k + 1)
    if small.size:
        c = int(small[np.argmin(sizes[small])])
        raise ValueError(
            f"the neighbour graph has {len(sizes)} connected components; component {c} has "
            f"{int(sizes[c])} points (e.g. point {int(np.flatnonzero(labels == c)[0])}), fewer than "
            f"n_neighbors + 1 = {k + 1}, so it cannot be fitted as its own problem; raise "
            "n_neighbors (joining it to the rest) or drop those cells"
        )


def placement(embeddings: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(centres (C, Q), scales (C,), offsets (C, Q)) of the arbitrary layout (module docstring)
    of the components' embeddings (each (n_c, Q))."""
    centres = np.stack([X.mean(axis=0) for X in embeddings])
    scales = np.array([np.sqrt(np.mean(np.sum((X - m) ** 2, axis=1))) for X, m in zip(embeddings, centres)])
    scales = np.where((scales > 0) & np.isfinite(scales), scales, 1.0)
    radius = max(
        float(np.max(np.linalg.norm((X - m) / s, axis=1), initial=0.0))
        for X, m, s in zip(embeddings, centres, scales)
    )
    step = SPACING * max(radius, 1.0)
    n_comp, q = centres.shape
    cols = int(np.ceil(np.sqrt(n_comp))) if q >= 2 else n_comp
    offsets = np.zeros((n_comp, q))
    offsets[:, 0] = (np.arange(n_comp) % cols) * step
    if q >= 2:
        offsets[:, 1] = (np.arange(n_comp) // cols) * step
    return centres, scales, offsets


def place(X, centre, scale, offset) -> np.ndarray:
    """A component's latent points (..., Q) in the combined layout."""
    return (X - centre) / scale + offset


def unplace(X, centre, scale, offset) -> np.ndarray:
    """The inverse of :func:`place`: placed points back in the component's own fit's frame."""
    return (X - offset) * scale + centre


def neighbour_index_graph(est, Y, graph):
    """GLLE's graph: kNN indices (``graph``, else the exact kNN of Y), union-symmetrised.

    Returns (what the family's own fit receives: ``graph`` itself when given, else the indices;
    the symmetric adjacency; a function (rows, inverse row map) -> the component's graph)."""
    k = int(est.n_neighbors)
    idx = knn(Y, k)[0] if graph is None else check_graph(graph, Y.shape[0], k)
    return (idx if graph is None else graph), adjacency(idx, mode="union"), lambda rows, inv: inv[idx[rows]]


# --------------------------------------------------------------------------- the decorator
def by_component(graph_of):
    """Class decorator of a graph model (module docstring). ``graph_of(est, Y, graph)`` gives, for
    checked data Y and the ``graph`` argument of ``fit``: (the graph the family's own fit gets, the
    symmetric adjacency whose components are fitted apart, a function (rows, inverse row map) ->
    the graph of the component of those rows, in its own numbering)."""

    def decorate(cls):
        fit = cls.fit

        @wraps(fit)
        def fit_by_component(self, Y, graph=None, **kwargs):
            self.__dict__.pop("components_", None)
            self._validate_params()
            Yc = check_data(Y)
            self._check_shapes(*Yc.shape)
            passed, W, sub_graph = graph_of(self, Yc, graph)
            n_comp, labels = component_labels(W)
            if n_comp == 1:
                fit(self, Y, passed, **kwargs)
                self.n_components_graph_, self.layout_arbitrary_ = 1, False
                return self
            check_component_sizes(labels, int(self.n_neighbors))
            subs = []
            for c in range(n_comp):
                rows = np.flatnonzero(labels == c)
                inv = np.full(len(labels), -1, dtype=np.int64)
                inv[rows] = np.arange(len(rows))
                subs.append(clone(self).fit(Yc[rows], sub_graph(rows, inv), **kwargs))
            _combine(self, subs, labels, Yc)
            return self

        cls.fit = fit_by_component
        for name in _DISPATCHED:
            if hasattr(cls, name):
                setattr(cls, name, _dispatcher(getattr(cls, name), name, graph_of))
        return cls

    return decorate


def _split(est) -> bool:
    """Whether ``est`` holds one model per component."""
    return est.__dict__.get("components_") is not None


def _dispatcher(method, name, graph_of):
    own = _COMPOSITE[name]

    @wraps(method)
    def dispatch(self, *args, **kwargs):
        if name == "_restore":
            if getattr(self, "n_components_graph_", 1) > 1:
                return _restore(self, graph_of, *args, **kwargs)
            out = method(self, *args, **kwargs)
            self.n_components_graph_, self.layout_arbitrary_ = 1, False
            return out
        if _split(self):
            return own(self, *args, **kwargs)
        return method(self, *args, **kwargs)

    return dispatch


def _combine(est, subs, labels, Y) -> None:
    """The combined fitted state of ``est`` from its components' fitted models ``subs``."""
    est.components_ = subs
    est.graph_labels_ = np.asarray(labels, dtype=np.int64)
    est.n_components_graph_, est.layout_arbitrary_ = len(subs), True
    est.rows_by_component_ = [np.flatnonzero(labels == c) for c in range(len(subs))]
    est.train_data_ = Y
    maps = placement([s.embedding_ for s in subs])
    est.component_centres_, est.component_scales_, est.component_offsets_ = maps
    n = len(labels)

    def rows_of(attr, how):
        parts = [getattr(s, attr, None) for s in subs]
        if any(p is None for p in parts):
            return None
        out = np.empty((n, *np.shape(parts[0])[1:]))
        for c, (rows, p) in enumerate(zip(est.rows_by_component_, parts)):
            out[rows] = how(np.asarray(p), c)
        return out

    placed = lambda X, c: place(X, *(m[c] for m in maps))  # noqa: E731
    shrunk = lambda V, c: V / maps[1][c] ** 2  # noqa: E731
    est.embedding_ = rows_of("embedding_", placed)
    est.embedding_var_ = rows_of("embedding_var_", shrunk)
    for attr, how in (
        ("embedding_cov_", shrunk),
        ("lle_embedding_", placed),
        ("weights_", lambda a, c: a),
        ("sigma_", lambda a, c: a),
        ("C_", lambda a, c: a * maps[1][c]),  # the local maps dy/dx in the placed frame
    ):
        if hasattr(subs[0], attr):
            setattr(est, attr, rows_of(attr, how))
    n_iter = max(int(s.n_iter_) for s in subs)
    traces = [np.asarray(s.elbo_trace_, dtype=np.float64) for s in subs]
    est.elbo_trace_ = np.sum([np.pad(t, (0, n_iter - len(t)), mode="edge") for t in traces], axis=0)
    est.elbo_ = float(est.elbo_trace_[-1])  # the sum of the components' final criteria
    est.n_iter_ = n_iter
    est.converged_ = all(bool(s.converged_) for s in subs)
    for attr in ("alpha_", "beta_", "gamma_", "data_scale_"):  # one per component: see components_
        if hasattr(subs[0], attr):
            setattr(est, attr, None)


def _assign(est, Y_new) -> np.ndarray:
    """The component of each new row: the one most of its ``n_neighbors`` nearest training rows
    belong to; ties to the one of the nearest among them."""
    lab = est.graph_labels_[knn_query(est.train_data_, Y_new, int(est.n_neighbors))[0]]  # (m, k)
    counts = (lab[:, :, None] == np.arange(len(est.components_))).sum(axis=1)
    tied = counts == counts.max(axis=1, keepdims=True)
    first = np.argmax(np.take_along_axis(tied, lab, axis=1), axis=1)
    return lab[np.arange(len(lab)), first]


def _per_component(est, Y_new, answer):
    """``answer(c, sub, rows of Y_new)`` for each component's new rows, stitched in row order: an
    array, or a tuple of arrays (each (m, ...))."""
    Y_new = check_data(Y_new, "Y_new")
    if Y_new.shape[1] != est.train_data_.shape[1]:
        raise ValueError(
            f"Y_new has {Y_new.shape[1]} features, the model was fitted on {est.train_data_.shape[1]}"
        )
    comp = _assign(est, Y_new) if len(Y_new) else np.zeros(0, dtype=np.int64)
    out = None
    for c in range(len(est.components_)):
        r = np.flatnonzero(comp == c)
        if not r.size:
            continue
        got = answer(c, est.components_[c], Y_new[r])
        parts = got if isinstance(got, tuple) else (got,)
        if out is None:
            out = [np.empty((len(Y_new), *np.shape(p)[1:])) for p in parts]
        for o, p in zip(out, parts):
            o[r] = p
    if out is None:  # no rows: the shapes of one empty answer
        got = answer(0, est.components_[0], Y_new)
        return got
    return tuple(out) if len(out) > 1 else out[0]


def _maps(est, c):
    return est.component_centres_[c], est.component_scales_[c], est.component_offsets_[c]


def _transform(est, Y_new, return_var: bool = False, **kwargs):
    """Each new row's latent mean (and variance, or covariance) from its component's model, placed."""

    def answer(c, sub, Yr):
        got = sub.transform(Yr, return_var=return_var, **kwargs)
        if not isinstance(got, tuple):
            return place(got, *_maps(est, c))
        return place(got[0], *_maps(est, c)), got[1] / est.component_scales_[c] ** 2

    return _per_component(est, Y_new, answer)


def _score_samples(est, Y_new):
    return _per_component(est, Y_new, lambda c, sub, Yr: sub.score_samples(Yr))


def _mapping_score(est, Y_new):
    """Each new row's mapping score against its own component's reference (median, MAD)."""
    if getattr(est, "score_reference_", None) is None:
        raise ValueError(f"{type(est).__name__} has no reference scores; call reference_score_stats(Y_train)")
    return _per_component(est, Y_new, lambda c, sub, Yr: sub.mapping_score(Yr))


def _reference_score_stats(est, Y_train=None, random_state: int = 0):
    """Each component's reference (its own training rows, as its model scores them);
    ``score_reference_`` lists them flat (median_0, MAD_0, median_1, ...). Returns the largest
    component's (median, MAD)."""
    pairs = []
    for rows, sub in zip(est.rows_by_component_, est.components_):
        part = None if Y_train is None else np.asarray(Y_train)[rows]
        pairs.append(sub.reference_score_stats(part, random_state=random_state))
    est.score_reference_ = [float(v) for p in pairs for v in p]
    return pairs[int(np.argmax([len(r) for r in est.rows_by_component_]))]


def _sample(est, n_generations, random_state=None, cov_scale=None, **kwargs):
    """GLLE's generations of every component (the same seed for each, as its own fit), placed."""
    parts = [sub.sample(n_generations, random_state, cov_scale, **kwargs) for sub in est.components_]
    out = np.empty((*parts[0].shape[:-2], len(est.graph_labels_), parts[0].shape[-1]))
    for c, (rows, p) in enumerate(zip(est.rows_by_component_, parts)):
        out[..., rows, :] = place(p, *_maps(est, c))
    return out


def _sample_weights(est, random_state=None, cov_scale=None):
    """One draw of all reconstruction weights (N, k): each component's draw on its rows."""
    out = np.empty(est.weights_.shape)
    for rows, sub in zip(est.rows_by_component_, est.components_):
        out[rows] = sub.sample_weights(random_state, cov_scale)
    return out


def _inverse_transform(est, X):
    """Latent points of the combined layout -> data space, by the model of the component of the
    nearest placed training latent."""
    X = check_data(X, "X")
    comp = est.graph_labels_[knn_query(est.embedding_, X, 1)[0][:, 0]]
    out = None
    for c, sub in enumerate(est.components_):
        r = np.flatnonzero(comp == c)
        if r.size:
            Yr = sub.inverse_transform(unplace(X[r], *_maps(est, c)))
            out = np.empty((len(X), Yr.shape[1])) if out is None else out
            out[r] = Yr
    return np.empty((0, est.train_data_.shape[1])) if out is None else out


def _to_arrays(est):
    """The combined embedding, placement and trace, and each component's own ``to_arrays``."""
    arrays = {
        "embedding_": est.embedding_,
        "elbo_trace_": est.elbo_trace_,
        "graph_labels_": est.graph_labels_,
        "component_centres_": est.component_centres_,
        "component_scales_": est.component_scales_,
        "component_offsets_": est.component_offsets_,
    }
    if est.embedding_var_ is not None:
        arrays["embedding_var_"] = est.embedding_var_
    fitted = {}
    for c, sub in enumerate(est.components_):
        a, p = sub.to_arrays()
        arrays.update({_PREFIX.format(c) + name: v for name, v in a.items()})
        fitted[str(c)] = p["fitted"]
    ref = getattr(est, "score_reference_", None)
    params = {
        **{k: v for k, v in p.items() if k != "fitted"},
        "fitted": {
            "elbo_": est.elbo_,
            "n_iter_": est.n_iter_,
            "converged_": bool(est.converged_),
            "n_components_graph_": int(est.n_components_graph_),
            "layout_arbitrary_": True,
            "score_reference_": None if ref is None else [float(v) for v in ref],
            "components_fitted": fitted,
        },
    }
    return arrays, params


def _restore(est, graph_of, data=None, graph=None) -> None:
    """Each component's model back from its arrays and the store's data and graph restricted to
    its rows, then the combined state (the placement recomputed: the same numbers)."""
    Y = check_data(data)
    labels = np.asarray(est.graph_labels_, dtype=np.int64)
    if len(Y) != len(labels):
        raise ValueError(f"data has {len(Y)} rows, the model was fitted on {len(labels)}")
    _, _, sub_graph = graph_of(est, Y, graph)
    fitted = est.__dict__.pop("components_fitted")
    base = {"class": type(est).__name__, "format": MODEL_FORMAT, "params": est.get_params(deep=False)}
    base["needs_inputs"] = list(est.needs_inputs)
    subs = []
    for c in range(int(est.n_components_graph_)):
        prefix = _PREFIX.format(c)
        arrays = {
            name[len(prefix) :]: est.__dict__.pop(name)
            for name in list(est.__dict__)
            if name.startswith(prefix)
        }
        rows = np.flatnonzero(labels == c)
        inv = np.full(len(labels), -1, dtype=np.int64)
        inv[rows] = np.arange(len(rows))
        params = {**base, "fitted": fitted[str(c)]}
        subs.append(type(est).from_arrays(arrays, params, data=Y[rows], graph=sub_graph(rows, inv)))
    ref = est.__dict__.get("score_reference_")
    _combine(est, subs, labels, Y)
    est.score_reference_ = ref


_COMPOSITE = {
    "transform": _transform,
    "score_samples": _score_samples,
    "reference_score_stats": _reference_score_stats,
    "mapping_score": _mapping_score,
    "to_arrays": _to_arrays,
    "_restore": None,  # handled in the dispatcher (it needs graph_of)
    "sample": _sample,
    "sample_weights": _sample_weights,
    "inverse_transform": _inverse_transform,
}
