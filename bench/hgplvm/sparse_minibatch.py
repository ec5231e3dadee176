"""The sparse hyperboloid GP-LVM's minibatch fit against its full-batch fit on a binary tree (paper
002 section 5.1's data; kappa = 100, Q = 2, the constructor's defaults otherwise): final bound
(eq. 5 at the fitted state; the minibatch fit's is exact too), the tree score of bench/hgplvm/tree.py
(Pearson of hyperbolic latent against tree distances), steps and CPU seconds. One JSON line per fit.

    .venv/bin/python -m bench.hgplvm.sparse_minibatch --seed 0 --training minibatch --kw '{"batch_size": 100}'
    .venv/bin/python -m bench.hgplvm.sparse_minibatch --seed 0 --training full
"""


import argparse
import json
import time

import numpy as np
from scipy.spatial.distance import cdist


def main():
    from lvmcore.data.synthetic import binary_tree
    from lvmcore.manifolds.lorentz import pairwise_dist
    from lvmcore.metrics import pearson_distance_correlation
    from lvmcore.models.hgplvm import HyperboloidGPLVM

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depth", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--training", default="minibatch", choices=["full", "minibatch", "auto"])
    ap.add_argument("--kw", default="{}", help="JSON of constructor overrides")
    a = ap.parse_args()
    Y, node, codes, _ = binary_tree(a.depth, seed=a.seed)
    Dh = cdist(codes[node], codes[node], "cityblock")
    kw = dict(variant="sparse", n_components=2, kappa=100.0, random_state=a.seed, training=a.training)
    kw.update(json.loads(a.kw))
    c0, w0 = time.process_time(), time.perf_counter()
    m = HyperboloidGPLVM(**kw).fit(Y)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    Dl = np.asarray(pairwise_dist(m.lorentz_embedding_, m.lorentz_embedding_))
    out = dict(
        depth=a.depth, seed=a.seed, training=m.training_, kw=json.loads(a.kw), n=Y.shape[0],
        M=int(m.inducing_.shape[0]), elbo=m.elbo_, elbo_per_point=m.elbo_ / Y.shape[0],
        pearson=float(pearson_distance_correlation(Dl, Dh, "precomputed", "precomputed")),
        n_iter=m.n_iter_, converged=bool(m.converged_), cpu_s=cpu, wall_s=wall,
    )  # fmt: skip
    print(json.dumps(out))


if __name__ == "__main__":
    main()
