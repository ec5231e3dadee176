"""LLE and GLLE timings against scikit-learn's LLE in one run (paper 001 datasets: Swiss roll).

    python -m bench.glle.fit [--sizes 5000 50000] [--k 10]

For each n: scikit-learn LocallyLinearEmbedding (arpack, its own kNN), our LLE (exact kNN, batched
weights, sparse eigensolver), GLLE-EM fit with 10 EM iterations (plus its first generation),
GLLE direct-sampling fit, and the GLLE-EM fit chunked over a 2-process LocalCluster. Every time is
printed with its ratio to scikit-learn's LLE fit (targets: our LLE <= 1.2, GLLE-EM <= 5)."""


import argparse
import time


def timed(f):
    t0 = time.perf_counter()
    out = f()
    return time.perf_counter() - t0, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[5000, 50000])
    ap.add_argument("--k", type=int, default=10)
    a = ap.parse_args()
    from sklearn.manifold import LocallyLinearEmbedding

    from bench.common import local_client
    from lvmcore.data.synthetic import swiss_roll
    from lvmcore.graph import knn
    from lvmcore.lle import lle
    from lvmcore.metrics import unfolding as unfold
    from lvmcore.models.glle import GLLE

    knn(swiss_roll(500, seed=1)[0], a.k)  # load the kNN kernel's compiled code before timing
    print(f"{'n':>7s} {'method':28s} {'seconds':>8s} {'ratio':>6s} {'unfold':>6s}")
    kq = {"n_components": 2, "n_neighbors": a.k}
    for n in a.sizes:
        Y, lat = swiss_roll(n, seed=0)
        t = lat[:, 0]
        sk = LocallyLinearEmbedding(n_neighbors=a.k, n_components=2, eigen_solver="arpack", random_state=0)
        t_sk, E = timed(lambda: sk.fit_transform(Y))  # noqa: B023
        rows = [("scikit-learn LLE", t_sk, unfold(E, t))]
        t_our, (E, _) = timed(lambda: lle(Y, 2, knn(Y, a.k)[0], random_state=0))  # noqa: B023
        rows.append(("our LLE", t_our, unfold(E, t)))
        t_em, m = timed(lambda: GLLE(**kq, method="em", max_iter=10, tol=0, random_state=0).fit(Y))  # noqa: B023
        rows.append(("GLLE-EM (10 iterations)", t_em, unfold(m.embedding_, t)))
        t_d, m = timed(lambda: GLLE(**kq, method="direct", random_state=0).fit(Y))  # noqa: B023
        rows.append(("GLLE direct sampling", t_d, unfold(m.embedding_, t)))
        with local_client(2) as client:
            warm = GLLE(**kq, chunks=n // 4, max_iter=2, random_state=0)
            warm.fit(Y[:2000], client=client)  # warm the workers
            em = GLLE(**kq, method="em", max_iter=10, tol=0, chunks=n // 4, random_state=0)
            t_c, m = timed(lambda: em.fit(Y, client=client))  # noqa: B023
        rows.append(("GLLE-EM chunked, 2 processes", t_c, unfold(m.embedding_, t)))
        for name, sec, u in rows:
            print(f"{n:7d} {name:28s} {sec:8.2f} {sec / t_sk:6.2f} {u:6.3f}", flush=True)


if __name__ == "__main__":
    main()
