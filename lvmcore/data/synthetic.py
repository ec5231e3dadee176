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


def cite_seq_toy(n: int = 400, seed=0, n_genes: int = 40, n_proteins: int = 12):
    """Two modalities of the same cells, CITE-seq-like: RNA counts and a continuous protein panel.

    A shared trajectory t ~ U(0, 1) per cell (a differentiation's pseudotime) and a private signal
    per modality, c_rna and c_prot ~ U(-1, 1) (a cell-cycle-like programme each). Both modalities
    are non-linear in t and identify it without ambiguity:

    - RNA (n, n_genes), Poisson counts with log-rate log 20 + a_g exp(-(t - m_g)^2 / (2 w_g^2))
      (each gene transiently up along t: a bump at m_g ~ U(0, 1), width w_g ~ U(0.08, 0.2), height
      a_g ~ U(1, 2.5)); the first quarter of the genes instead log 20 + 1.2 c_rna b_g, b_g ~ +-1
      (the private programme, which the protein panel says nothing about);
    - protein (n, n_proteins), continuous: (cos pi t, sin pi t) V_j, V_j ~ N(0, 1.5^2 I) (t on a
      half circle, one-to-one, linearly mapped to the panel) plus N(0, 0.1^2); the last quarter of
      the proteins instead 1.5 c_prot b_j plus that noise.

    The genes' narrow bumps are not linear in the proteins (a ridge regression from the panel
    cannot form them); a model of the shared t can.

    Returns (rna counts (n, n_genes) float64, protein (n, n_proteins), latents (n, 3) = (t, c_rna,
    c_prot))."""
    n = _check_n(n)
    n_genes = _check_n(n_genes, "n_genes", 4)
    n_proteins = _check_n(n_proteins, "n_proteins", 4)
    rng = _rng(seed)
    t, c_rna, c_prot = rng.uniform(0.0, 1.0, n), rng.uniform(-1.0, 1.0, n), rng.uniform(-1.0, 1.0, n)
    g_priv, p_priv = n_genes // 4, n_proteins // 4
    m, w, a = rng.uniform(0.0, 1.0, n_genes), rng.uniform(0.08, 0.2, n_genes), rng.uniform(1.0, 2.5, n_genes)
    log_rate = np.log(20.0) + a * np.exp(-((t[:, None] - m) ** 2) / (2.0 * w**2))
    b = rng.choice([-1.0, 1.0], size=g_priv)
    log_rate[:, :g_priv] = np.log(20.0) + 1.2 * c_rna[:, None] * b
    rna = rng.poisson(np.exp(log_rate)).astype(np.float64)
    arc = np.column_stack([np.cos(np.pi * t), np.sin(np.pi * t)])
    arc = arc @ rng.normal(0.0, 1.5, (2, n_proteins - p_priv))
    private = 1.5 * c_prot[:, None] * rng.choice([-1.0, 1.0], size=p_priv)
    prot = np.hstack([arc, private]) + 0.1 * rng.standard_normal((n, n_proteins))
    return rna, prot, np.column_stack([t, c_rna, c_prot])
