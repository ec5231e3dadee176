"""A neighbour graph in several pieces (issue 52 item 4): GLLE and LL-LVM fit each connected
component of the kNN graph as its own problem and place the pieces in one arbitrary layout
(lvmcore.models.components); the evaluation computes its metrics within components, weighted by
size (tasks.evaluate.component_metrics)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.manifold import trustworthiness as sk_trustworthiness

from lvmcore.graph import adjacency, connected_components, knn, knn_query
from lvmcore.models.components import SPACING, check_component_sizes, component_labels, unplace
from lvmcore.models.glle import GLLE
from lvmcore.models.lllvm import LLLVM
from lvmcore.models.persist import model_from_arrays
from tasks.evaluate import component_metrics, component_weights, evaluate_point, weighted_metrics
from tasks.fit import fit_point
from tasks.ingest import ingest_dataset
from tasks.inputs import load_data
from tasks.knn import build_graph

K = 8
SIZES = (90, 60)
GLLE_ARGS = {"n_components": 2, "n_neighbors": K, "random_state": 0}
LLLVM_ARGS = {"n_components": 2, "n_neighbors": K, "random_state": 0, "max_iter": 8}


def _sheet(rng, n, shift):
    """A rolled 2-D sheet in 3-D: one connected piece of the kNN graph at k = 8."""
    u = rng.uniform(0, 1, (n, 2))
    t = 1.5 * np.pi * (1 + u[:, 0])
    return np.c_[t * np.cos(t) / 5, 2 * u[:, 1], t * np.sin(t) / 5] + shift


@pytest.fixture(scope="module")
def pieces():
    """Two well-separated sheets, their rows interleaved (so a component is not a row range)."""
    rng = np.random.default_rng(0)
    Y = np.vstack([_sheet(rng, SIZES[0], 0.0), _sheet(rng, SIZES[1], 50.0)])
    order = rng.permutation(len(Y))
    Y = Y[order]
    truth = (order >= SIZES[0]).astype(np.int64)  # the sheet of each row
    idx = knn(Y, K)[0]
    assert connected_components(adjacency(idx))[0] == 2
    return Y, idx, truth


@pytest.fixture(scope="module")
def fits(pieces):
    Y, idx, _ = pieces
    return {
        "glle_em": GLLE(**GLLE_ARGS).fit(Y, graph=idx),
        "glle_direct": GLLE(method="direct", **GLLE_ARGS).fit(Y, graph=idx),
        "lllvm": LLLVM(**LLLVM_ARGS).fit(Y, graph=idx),
    }


def _alone(key, Y):
    if key == "lllvm":
        return LLLVM(**LLLVM_ARGS).fit(Y)
    return GLLE(method=key.split("_")[1], **GLLE_ARGS).fit(Y)


@pytest.mark.parametrize("key", ["glle_em", "glle_direct", "lllvm"])
def test_each_component_is_its_fit_alone(key, pieces, fits):
    Y, _, truth = pieces
    est = fits[key]
    assert est.n_components_graph_ == 2 and est.layout_arbitrary_ is True
    # components numbered by their first row
    assert np.array_equal(est.graph_labels_, truth if truth[0] == 0 else 1 - truth)
    total = 0.0
    for c in range(2):
        rows = np.flatnonzero(est.graph_labels_ == c)
        alone = _alone(key, Y[rows])
        maps = est.component_centres_[c], est.component_scales_[c], est.component_offsets_[c]
        # the layout's translation and scale undone: the fit of that component alone
        np.testing.assert_allclose(unplace(est.embedding_[rows], *maps), alone.embedding_, rtol=0, atol=1e-12)
        if alone.embedding_var_ is not None:
            np.testing.assert_allclose(
                est.embedding_var_[rows] * maps[1] ** 2, alone.embedding_var_, rtol=1e-13, atol=0
            )
        total += alone.elbo_
        # the placed component: centred at its offset, unit root mean square radius
        P = est.embedding_[rows]
        np.testing.assert_allclose(P.mean(axis=0), maps[2], atol=1e-12)
        assert np.sqrt(np.mean(np.sum((P - maps[2]) ** 2, axis=1))) == pytest.approx(1.0, rel=1e-12)
    # the criterion of independent models of disjoint rows: the sum
    assert est.elbo_ == pytest.approx(total, rel=1e-13) and est.elbo_ == est.elbo_trace_[-1]
    # the pieces do not overlap: centres further apart than the sum of the largest radii
    off = est.component_offsets_
    radii = [
        np.max(np.linalg.norm(est.embedding_[est.graph_labels_ == c] - off[c], axis=1)) for c in range(2)
    ]
    gap = np.linalg.norm(est.component_offsets_[1] - est.component_offsets_[0])
    assert gap == pytest.approx(SPACING * max(max(radii), 1.0)) and gap > 2 * max(radii)


@pytest.mark.parametrize("key", ["glle_em", "lllvm"])
def test_new_points_go_to_their_component_each_alone(key, pieces, fits):
    Y, idx, _ = pieces
    est = fits[key]
    rng = np.random.default_rng(1)
    n_new = 12 if key == "glle_em" else 4  # LL-LVM's out-of-sample step costs ~0.4 s a point here
    Yn = Y[rng.choice(len(Y), n_new, replace=False)] + 0.01 * rng.standard_normal((n_new, 3))
    mean, var = est.transform(Yn, return_var=True)
    comp = est.graph_labels_[knn_query(Y, Yn, 1)[0][:, 0]]  # the nearest training row's
    for c in range(2):
        r = np.flatnonzero(comp == c)
        sub = est.components_[c]
        maps = est.component_centres_[c], est.component_scales_[c], est.component_offsets_[c]
        m, v = sub.transform(Yn[r], return_var=True)
        np.testing.assert_allclose(unplace(mean[r], *maps), m, rtol=0, atol=1e-12)
        np.testing.assert_allclose(var[r] * maps[1] ** 2, v, rtol=1e-13, atol=0)
        np.testing.assert_array_equal(est.score_samples(Yn[r]), sub.score_samples(Yn[r]))
    # per-cell determinism: each cell's answer alone equals its answer in the batch
    for i in (0, n_new - 1):
        np.testing.assert_allclose(est.transform(Yn[i : i + 1]), mean[i : i + 1], rtol=0, atol=1e-8)
    # mapping scores against each component's own reference
    est.reference_score_stats()
    assert len(est.score_reference_) == 4
    assert np.all(np.isfinite(est.mapping_score(Yn)))


def test_glle_generations_per_component(pieces, fits):
    est = fits["glle_em"]
    gens = est.sample(2, random_state=3)
    study = est.sample(1, random_state=3, cov_scale=[0.1, 1.0])
    assert gens.shape == (2, len(pieces[0]), 2) and study.shape == (2, 1, len(pieces[0]), 2)
    for c in range(2):
        rows = np.flatnonzero(est.graph_labels_ == c)
        maps = est.component_centres_[c], est.component_scales_[c], est.component_offsets_[c]
        np.testing.assert_allclose(unplace(gens[:, rows], *maps), est.components_[c].sample(2, 3), atol=1e-12)
    # generation 0 at the constructor's a is the kept embedding, as with one component
    np.testing.assert_allclose(est.sample(1, random_state=0)[0], est.embedding_, rtol=0, atol=1e-12)
    w = est.sample_weights(random_state=4)
    assert w.shape == (len(pieces[0]), K) and np.allclose(w.sum(axis=1), 1.0)


@pytest.mark.parametrize("key", ["glle_em", "lllvm"])
def test_round_trip_with_components(key, pieces, fits):
    Y, idx, _ = pieces
    est = fits[key]
    est.reference_score_stats()
    arrays, params = est.to_arrays()
    assert all(a.dtype in (np.float64, np.int64) for a in arrays.values())
    params = json.loads(json.dumps(params))  # JSON-able
    back = model_from_arrays(arrays, params, data=Y, graph=idx)
    assert back.n_components_graph_ == 2 and back.layout_arbitrary_ is True
    Yn = Y[: 20 if key == "glle_em" else 3] + 0.01
    for name in ("embedding_", "elbo_trace_", "component_offsets_"):
        np.testing.assert_array_equal(getattr(back, name), getattr(est, name))
    for a, b in zip(back.transform(Yn, return_var=True), est.transform(Yn, return_var=True)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-10)
    np.testing.assert_allclose(back.score_samples(Yn), est.score_samples(Yn), rtol=0, atol=1e-10)
    np.testing.assert_allclose(back.mapping_score(Yn), est.mapping_score(Yn), rtol=0, atol=1e-10)
    if key == "glle_em":
        np.testing.assert_allclose(back.sample(2, 5), est.sample(2, 5), rtol=0, atol=1e-10)
    else:
        X = est.embedding_[:5] + 0.01
        np.testing.assert_allclose(back.inverse_transform(X), est.inverse_transform(X), rtol=0, atol=1e-10)


@pytest.mark.parametrize(
    "cls, args", [(GLLE, GLLE_ARGS), (GLLE, {**GLLE_ARGS, "method": "direct"}), (LLLVM, LLLVM_ARGS)]
)
def test_one_component_is_the_single_path_bit_for_bit(cls, args, pieces):
    """A connected graph: the decorated fit is the family's own fit (its undecorated function),
    every output and the persisted model identical."""
    Y, idx, _ = pieces
    labels = component_labels(adjacency(idx))[1]
    rows = np.flatnonzero(labels == np.argmin(np.bincount(labels)))  # the smaller sheet alone
    Yc = Y[rows]
    a = cls(**args).fit(Yc)
    b = cls(**args)
    type(b).fit.__wrapped__(b, Yc)  # the single-component path, without the components' wrapper
    assert a.n_components_graph_ == 1 and a.layout_arbitrary_ is False
    arrays_a, params_a = a.to_arrays()
    arrays_b, params_b = b.to_arrays()
    assert arrays_a.keys() == arrays_b.keys() and params_a == params_b
    for name in arrays_a:
        np.testing.assert_array_equal(arrays_a[name], arrays_b[name])
    Yn = Yc[:3] + 0.01
    np.testing.assert_array_equal(a.transform(Yn), b.transform(Yn))
    # a loaded single-component model says it has one
    back = model_from_arrays(arrays_a, params_a, data=Yc, graph=knn(Yc, K)[0])
    assert back.n_components_graph_ == 1 and back.layout_arbitrary_ is False


def test_a_too_small_component_is_refused_with_its_size(pieces):
    Y, idx, _ = pieces
    W = adjacency(idx).tolil()
    # a triangle of three points cut off from the rest
    tri = [0, 1, 2]
    for i in tri:
        W[i, :] = 0
        W[:, i] = 0
    for i in tri:
        for j in tri:
            if i != j:
                W[i, j] = 1
    W = sp.csr_matrix(W)
    W.eliminate_zeros()
    assert connected_components(W)[0] >= 2
    with pytest.raises(
        ValueError, match=r"component 0 has 3 points .*n_neighbors \+ 1 = 9.*raise n_neighbors"
    ):
        LLLVM(**LLLVM_ARGS).fit(Y, graph=W)
    with pytest.raises(ValueError, match="has 5 points"):
        check_component_sizes(np.array([0] * 5 + [1] * 20), 8)
    check_component_sizes(np.array([0] * 9 + [1] * 20), 8)  # k + 1 points: accepted


def test_metrics_within_components_weighted_by_size(pieces, fits):
    """trustworthiness within each component (against scikit-learn's on the component alone),
    averaged with weights n_c / N; the arbitrary placement does not change the score."""
    Y, _, _ = pieces
    est = fits["glle_em"]
    lab = est.graph_labels_
    X = est.embedding_
    D = lambda A: np.linalg.norm(A[:, None] - A[None], axis=2)  # noqa: E731
    got = component_metrics(Y, D(Y), D(X), X, lab, None, None, None, False)
    ref = 0.0
    for c in range(2):
        r = lab == c
        k = min(10, r.sum() // 2 - 1)
        ref += r.sum() / len(lab) * sk_trustworthiness(Y[r], X[r], n_neighbors=k)
    assert got["trustworthiness"] == pytest.approx(ref, abs=1e-12)
    # moving a component (another arbitrary layout) changes nothing
    X2 = X.copy()
    X2[lab == 1] = 3.0 * X2[lab == 1] + 100.0
    again = component_metrics(Y, D(Y), D(X2), X2, lab, None, None, None, False)
    for name in ("trustworthiness", "continuity", "qlocal", "qglobal", "shepard_goodness"):
        assert again[name] == pytest.approx(got[name], abs=1e-12), name
    # weights n_c / N over the components with enough evaluated rows; a metric missing in one
    # component is averaged over the others
    parts, w = component_weights(np.array([0] * 6 + [1] * 2 + [2] * 12))
    assert [len(p) for p in parts] == [6, 12] and np.allclose(w, [6 / 18, 12 / 18])
    out = weighted_metrics([{"a": 1.0, "b": 2.0}, {"a": 4.0}], np.array([0.25, 0.75]))
    assert out["a"] == pytest.approx(0.25 + 3.0) and out["b"] == 2.0


def test_a_sweep_point_records_the_components_and_scores_within_them(pieces, tmp_path):
    """Through the sweep's own fit and evaluation: the point's n_components_graph output, the
    generations of both pieces, the metrics within components (trustworthiness against
    scikit-learn's on each component alone, weighted n_c / N)."""
    Y, _, _ = pieces
    np.save(tmp_path / "pieces.npy", Y)
    data = ingest_dataset(str(tmp_path / "pieces.npy"), str(tmp_path / "pieces.zarr"))
    graph = build_graph(data, K, str(tmp_path / "graph.zarr"))
    point = {"k": K, "latent_dim": 2, "seed": 0}
    res = fit_point("glle_em", {}, data, graph, (0, 0, 0), point, n_generations=2)
    assert res.status == "done", res.error
    assert res.extras["n_components_graph"] == 2 and res.extras["generations"].shape == (2, len(Y), 2)
    res = evaluate_point(res, data)
    assert not res.error, res.error
    Yd, lab = load_data(data)["Y"], res.model[0]["graph_labels_"]
    ref = sum(
        np.mean(lab == c) * sk_trustworthiness(Yd[lab == c], res.embedding[lab == c], n_neighbors=10)
        for c in range(2)
    )
    assert res.metrics["trustworthiness"] == pytest.approx(ref, abs=1e-12)
    assert all(np.isfinite(res.metrics[m]) for m in ("continuity", "qlocal", "qglobal", "shepard_goodness"))
