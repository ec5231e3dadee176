"""Seeded synthetic data sets with their true latent coordinates.

Every generator takes ``n`` (or ``depth``) and ``seed`` and returns plain NumPy arrays; the
xarray wrapping lives in :mod:`lvmcore.data.loaders`. Recipes follow ``shared/DATASETS.md``
(papers 000, 001, 002, 004). All outputs are float64.
"""

from __future__ import annotations

import numpy as np


def _rng(seed) -> np.random.Generator:
    return np.random.default_rng(seed)


def _check_n(n, name="n", minimum=2) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {n!r}")
    return int(n)


def lllvm_swiss_roll(n: int = 400, seed=0):
    """The LL-LVM authors' Swiss roll (paper 000/003).

    u, v ~ U(0, 1); t = 1.25 pi (1 + 2u); h = 10 v; y = (0.35 t cos t, h, 0.35 t sin t).
    Returns ``Y`` (n, 3), ``latent`` (n, 2) = (t, h) and ``isometric`` (n, 2) = (s(t), h) with
    s the arc length, the coordinates to compare with by Procrustes.
    """
    n = _check_n(n)
    rng = _rng(seed)
    u, v = rng.random(n), rng.random(n)
    t = 1.25 * np.pi * (1.0 + 2.0 * u)
    h = 10.0 * v
    Y = np.column_stack([0.35 * t * np.cos(t), h, 0.35 * t * np.sin(t)])
    s = 0.35 * (t * np.sqrt(1.0 + t**2) + np.arcsinh(t)) / 2.0
    return Y, np.column_stack([t, h]), np.column_stack([s, h])


def gaussian_blob(n: int = 800, seed=0):
    """LL-LVM 3-D Gaussian: y1, y2 ~ N(0,1), y3 = exp(-(y1^2+y2^2)/2) / (2 pi). Returns (Y, latent)."""
    n = _check_n(n)
    rng = _rng(seed)
    y12 = rng.standard_normal((n, 2))
    y3 = np.exp(-0.5 * np.sum(y12**2, axis=1)) / (2.0 * np.pi)
    return np.column_stack([y12, y3]), y12.copy()


def _sklearn_sheet(make, n, seed):
    """(Y, latent) of a scikit-learn 2-D sheet generator (no noise), latent = (t, height)."""
    Y, t = make(_check_n(n), random_state=np.random.RandomState(_rng(seed).integers(2**31)))
    return Y.astype(np.float64), np.column_stack([t, Y[:, 1]])


def s_curve(n: int = 5000, seed=0):
    """scikit-learn's S-curve (no noise). Returns (Y, latent) with latent = (t, height)."""
    from sklearn.datasets import make_s_curve  # scikit-learn is heavy: imported for this set only

    return _sklearn_sheet(make_s_curve, n, seed)


def swiss_roll(n: int = 5000, seed=0):
    """scikit-learn's Swiss roll (no noise). Returns (Y, latent) with latent = (t, height)."""
    from sklearn.datasets import make_swiss_roll  # scikit-learn is heavy: imported for this set only

    return _sklearn_sheet(make_swiss_roll, n, seed)


def swiss_hole(n: int = 5000, seed=0):
    """Swiss roll with a hole (paper 001): t = 1.5 pi (1 + 2u), (t cos t, 21 v, t sin t), with the
    points -10 < x < -5, -4 < z < 7, 5 < y < 15 removed; drawn until n remain. Returns (Y, latent)."""
    n = _check_n(n)
    rng = _rng(seed)
    keep_Y, keep_L, have = [], [], 0
    while have < n:
        m = 2 * (n - have) + 16
        u, v = rng.random(m), rng.random(m)
        t = 1.5 * np.pi * (1.0 + 2.0 * u)
        x, y, z = t * np.cos(t), 21.0 * v, t * np.sin(t)
        hole = (x > -10) & (x < -5) & (z > -4) & (z < 7) & (y > 5) & (y < 15)
        keep_Y.append(np.column_stack([x, y, z])[~hole])
        keep_L.append(np.column_stack([t, y])[~hole])
        have += int((~hole).sum())
    return np.concatenate(keep_Y)[:n], np.concatenate(keep_L)[:n]


def severed_bowl(n: int = 5000, seed=0):
    """Severed bowl (paper 001): p ~ U(0, 2 pi - 1), t ~ U(0, pi) kept where pi/3 < t < 4 pi / 5;
    point (sin t cos p, sin t sin p, cos t); rejection-sampled until n remain. Returns (Y, latent=(p, t))."""
    n = _check_n(n)
    rng = _rng(seed)
    keep, have = [], 0
    while have < n:
        m = 3 * (n - have) + 16
        p = rng.uniform(0.0, 2.0 * np.pi - 1.0, m)
        t = rng.uniform(0.0, np.pi, m)
        ok = (t > np.pi / 3.0) & (t < 4.0 * np.pi / 5.0)
        keep.append(np.column_stack([p[ok], t[ok]]))
        have += int(ok.sum())
    lat = np.concatenate(keep)[:n]
    p, t = lat[:, 0], lat[:, 1]
    Y = np.column_stack([np.sin(t) * np.cos(p), np.sin(t) * np.sin(p), np.cos(t)])
    return Y, lat


def binary_tree(depth: int = 4, n_per_node: int = 20, seed=0):
    """Synthetic binary tree of paper 002 (section 5.1) as in the authors' released data.

    2^depth - 1 nodes in heap order (children of v: 2v+1, 2v+2). ``codes[v, u] = 1`` if u is v or
    an ancestor of v. Each sample of node v starts at ``codes[v]``; for every non-root node a on
    the root-to-v path, with sibling s, the pair (x_a, x_s) becomes (cos t, sin t) with
    t ~ U(0, pi/4) drawn per sample and level. Root samples are the bare code.

    Returns ``Y`` (n_nodes * n_per_node, n_nodes), ``node`` (n,) the node of each sample,
    ``codes`` (n_nodes, n_nodes) and ``depth_label`` (n,) = depth of the node (root 0).
    Hamming distances between samples are those of ``codes[node]``.
    """
    depth = _check_n(depth, "depth", minimum=1)
    n_per_node = _check_n(n_per_node, "n_per_node", minimum=1)
    rng = _rng(seed)
    n_nodes = 2**depth - 1
    parent = np.array([-1] + [(v - 1) // 2 for v in range(1, n_nodes)])
    codes = np.zeros((n_nodes, n_nodes))
    for v in range(n_nodes):
        a = v
        while a >= 0:
            codes[v, a] = 1.0
            a = parent[a]
    node = np.repeat(np.arange(n_nodes), n_per_node)
    Y = codes[node].copy()
    for i, v in enumerate(node):
        a = v
        while a > 0:
            s = a + 1 if a % 2 == 1 else a - 1
            t = rng.uniform(0.0, np.pi / 4.0)
            Y[i, a], Y[i, s] = np.cos(t), np.sin(t)
            a = parent[a]
    depth_label = np.floor(np.log2(node + 1)).astype(np.int64)
    return Y, node, codes, depth_label


def mrd_toy(n: int = 100, seed=0, noise: float = 0.1):
    """MRD toy views (paper 004, section 5.1).

    t = linspace(0, 4 pi, n); private cos t (view 0) and sin t (view 1), shared cos^2 t; each
    private signal mapped to 10 dims and the shared one to 5 dims by N(0, 1) matrices,
    concatenated to 15 dims per view, plus N(0, noise^2). Returns ``views`` [Y0, Y1] and the
    latent signals (n, 3) = (cos t, sin t, cos^2 t).
    """
    n = _check_n(n)
    rng = _rng(seed)
    t = np.linspace(0.0, 4.0 * np.pi, n)
    private = [np.cos(t)[:, None], np.sin(t)[:, None]]
    shared = (np.cos(t) ** 2)[:, None]
    views = []
    for p in private:
        Wp = rng.standard_normal((1, 10))
        Ws = rng.standard_normal((1, 5))
        Yv = np.hstack([p @ Wp, shared @ Ws])
        views.append(Yv + noise * rng.standard_normal(Yv.shape))
    return views, np.column_stack([np.cos(t), np.sin(t), np.cos(t) ** 2])
