"""The Bayesian hGP-LVM's collapsed bound term by term at the end of a fit, against M (issue 24).

    python -m bench.hgplvm.bayes_m --data 4 5 myeloid --seeds 0 1 --m 64 128 256 [--kw '{...}']
                                   [--out /tmp/bm.csv] [--max-iter 3000]
                                   [--noise-c 0.25] [--estimates]

Per data set, seed and M (an integer, "auto", or "n" for M = N with Z started at every initial mean), one
Bayesian fit (kappa = 100, Q = 2, constructor defaults otherwise, overridden by --kw), then the
bound's parts at the fitted state from H = 50 fresh Monte-Carlo samples per point:

    fit   = the collapsed bound (eq. 6) without the trace term and the KL
    trace = (beta D / 2) (psi0 - tr(K_mm^-1 Psi2)), the Nystrom penalty the bound subtracts
    kl    = KL(q(X) || p(X))

printed beside the score (trees: Pearson of hyperbolic latent distances vs Hamming distances of the
node codes; myeloid: Qlocal / Qglobal), sigma, beta, the largest latent radius and the median S.
Rows go to --out (CSV).

``--noise-c C`` fixes the noise variance at C x the 2-D PPCA level of each data set
(:func:`lvmcore.pca.ppca_noise_variance`).
``--estimates`` fits nothing: per data set and seed it prints noise estimates from Y alone (the
2-D PPCA level; the local 2-D noise, the mean over points of the D - 2 smallest eigenvalues of the
covariance of each point's k nearest neighbours, k = 10, 20, 40, as a multiple of the PPCA level;
Minka's PPCA dimension, scikit-learn ``n_components="mle"``) and the sparse bound (eq. 5) of the
raw Y minus that of the centred Y at a PCA layout of radius 2.2 (Z every 5th point)."""

import argparse
import csv
import json
import os
import time

import numpy as np
from scipy.spatial.distance import cdist

from bench.common import ROOT

COLUMNS = [
    "data", "seed", "m", "kw", "pearson", "qlocal", "qglobal", "seconds", "n_iter", "sigma", "beta",
    "rmax", "median_S", "bound", "fit", "trace", "kl",
]  # fmt: skip


def bound_parts(m, Y, H=50, seed=0):
    """(bound, fit, trace, kl) of fitted model ``m`` on data ``Y`` from H fresh MC samples."""
    import jax
    import jax.numpy as jnp

    from lvmcore import collapsed
    from lvmcore.kernels.hyperbolic import he_kernel
    from lvmcore.linalg import KERNEL_JITTER
    from lvmcore.psi.monte_carlo import mc_psi_chunk

    with jax.enable_x64(True):
        Yc = jnp.asarray(Y - m.mean_)
        n, d = Yc.shape
        mu = jnp.asarray(m.lorentz_embedding_)
        S = jnp.asarray(m.embedding_var_)
        Z = jnp.asarray(m.inducing_)
        eps = jax.random.normal(jax.random.PRNGKey(seed), (H, n, S.shape[1]))
        plv = 2.0 * np.log(m.prior_scale_)
        psi0, psi1ty, psi2, kl = mc_psi_chunk(mu, S, eps, Yc, Z, m.sigma_, m.kappa, plv)
        Kmm = he_kernel(Z, Z, m.sigma_, m.kappa)
        t = collapsed.terms(Kmm, psi1ty, psi2, m.beta_, KERNEL_JITTER)
        lb = jnp.log(m.beta_)
        b = collapsed.bound(t, psi0, jnp.sum(Yc * Yc), lb, n, d)
        trace = 0.5 * m.beta_ * d * (psi0 - jnp.trace(t.C))
        return float(b - kl), float(b + trace), float(trace), float(kl)


def estimates(Y, sigma, beta):
    """Print the noise estimates and the raw-minus-centred bound gap of ``--estimates``."""
    import jax
    import jax.numpy as jnp
    from sklearn.decomposition import PCA
    from sklearn.neighbors import NearestNeighbors

    from lvmcore.manifolds.lorentz import expmap0
    from lvmcore.models.hgplvm import sparse_objective
    from lvmcore.pca import pca_start, ppca_noise_variance

    p = ppca_noise_variance(Y, 2)
    loc = []
    for k in (10, 20, 40):
        _, idx = NearestNeighbors(n_neighbors=k + 1).fit(Y).kneighbors(Y)
        nv = []
        for ix in idx:
            ev = np.sort(np.linalg.svd(Y[ix] - Y[ix].mean(0), compute_uv=False) ** 2 / len(ix))[::-1]
            nv.append(np.pad(ev, (0, max(0, Y.shape[1] - len(ev))))[2:].mean())
        loc.append(round(float(np.mean(nv)) / p, 4))
    k_mle = PCA(n_components="mle").fit(Y).n_components_
    with jax.enable_x64(True):
        P = pca_start(Y, 2)
        X = expmap0(jnp.asarray(2.2 * P / np.linalg.norm(P, axis=1).max()))
        args = (X, X[::5], np.log(sigma), np.log(beta))
        gap = float(sparse_objective(*args, jnp.asarray(Y), 100.0)) - float(
            sparse_objective(*args, jnp.asarray(Y - Y.mean(0)), 100.0)
        )
    m2 = float(np.sum(Y.mean(0) ** 2))
    print(
        f"ppca {p:.5g} local/ppca k=10,20,40 {loc} mle_dim {k_mle} of D={Y.shape[1]}; raw-centred bound "
        f"{gap:.2f} nats (sigma {sigma}, beta {beta}; -sum m^2/(2 sigma) = {-m2 / (2 * sigma):.2f})"
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", nargs="+", default=["4"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--m", nargs="+", default=["64"])
    ap.add_argument("--kw", default="{}")
    ap.add_argument("--max-iter", type=int, default=3000)
    ap.add_argument("--out", default="/tmp/hgplvm_bayes_m.csv")
    ap.add_argument("--noise-c", type=float, default=None, help="noise variance = C x the 2-D PPCA level")
    ap.add_argument("--estimates", action="store_true", help="noise estimates and the raw-Y gap; no fit")
    a = ap.parse_args()
    import jax

    from lvmcore.data.synthetic import binary_tree
    from lvmcore.manifolds.lorentz import pairwise_dist
    from lvmcore.metrics import manifold_distances, pearson_distance_correlation, quality_scores
    from lvmcore.models.hgplvm import BayesianHyperboloidGPLVM
    from lvmcore.pca import ppca_noise_variance

    kw = json.loads(a.kw)
    new = not os.path.exists(a.out)
    with open(a.out, "a", newline="") as fh:
        w = csv.writer(fh)
        if new:
            w.writerow(COLUMNS)
        for data in a.data:
            for seed in a.seeds:
                if data == "myeloid":
                    Y = np.loadtxt(ROOT / "tests" / "data" / "krumsiek11.txt")[:, 1:]
                    G = manifold_distances(Y, 20)
                else:
                    Y, node, codes, _ = binary_tree(int(data), seed=seed)
                    Dh = cdist(codes[node], codes[node], "cityblock")
                if a.estimates:  # sigma, beta of the learned-noise fits (depth 4 seed 0, myeloid seed 0)
                    print(data, seed, end=" ")
                    estimates(Y, *((0.08, 1.2e4) if data == "myeloid" else (1.0, 340.0)))
                    continue
                for mm in a.m:
                    M = Y.shape[0] if mm == "n" else ("auto" if mm == "auto" else int(mm))
                    params = dict(n_components=2, kappa=100.0, training="full", max_iter=a.max_iter)
                    params.update(random_state=seed, n_inducing=M)
                    if a.noise_c is not None:
                        params["noise"] = a.noise_c * ppca_noise_variance(Y, 2)
                    t0 = time.perf_counter()
                    m = BayesianHyperboloidGPLVM(**{**params, **kw}).fit(Y)
                    sec = time.perf_counter() - t0
                    L = m.lorentz_embedding_
                    with jax.enable_x64(True):
                        D = np.asarray(pairwise_dist(L, L))
                    pr = ql = qg = ""
                    if data == "myeloid":
                        ql, qg, _ = quality_scores(None, D, metric_x="precomputed", data_distances=G)
                        ql, qg = f"{ql:.4f}", f"{qg:.4f}"
                    else:
                        pr = f"{pearson_distance_correlation(D, Dh, 'precomputed', 'precomputed'):.4f}"
                    b, fit, tr, kl = bound_parts(m, Y)
                    rmax = float(np.arccosh(np.maximum(L[:, 0], 1.0)).max())
                    medS = float(np.median(m.embedding_var_))
                    M = m.inducing_.shape[0]
                    tag = f"{a.kw} noise_c={a.noise_c}"
                    row = [data, seed, M, tag, pr, ql, qg, f"{sec:.1f}", m.n_iter_, f"{m.sigma_:.4g}",
                           f"{m.beta_:.4g}", f"{rmax:.3f}", f"{medS:.3g}", f"{b:.1f}", f"{fit:.1f}",
                           f"{tr:.1f}", f"{kl:.1f}"]  # fmt: skip
                    w.writerow(row)
                    fh.flush()
                    print(" ".join(f"{c}={v}" for c, v in zip(COLUMNS, row) if c != "kw"), flush=True)


if __name__ == "__main__":
    main()
