"""GLLE covariance-scale study (paper 001 section VI-C) on the four manifolds, 5,000 points, k = 10.

For each dataset, variant and a in (0.01, 0.1, 1, 5, 10): mean / min |Spearman| of the best
embedding coordinate (any direction: ``lvmcore.metrics.unfolding``) with the manifold parameter over
5 generations, and the mean Procrustes disparity of the generations to the LLE embedding.

    python bench/glle_scale.py
"""

import numpy as np
from scipy.spatial import procrustes

from lvmcore.data import synthetic as S
from lvmcore.metrics import unfolding
from lvmcore.models.glle import GLLE

SCALES = (0.01, 0.1, 1, 5, 10)


def main():
    print("dataset method " + " ".join(f"a={a:<5g}" for a in SCALES))
    for name in ("s_curve", "swiss_roll", "swiss_hole", "severed_bowl"):
        Y, lat = getattr(S, name)(5000, seed=0)
        for method in ("em", "direct"):
            m = GLLE(n_components=2, n_neighbors=10, method=method, random_state=0).fit(Y)
            cells = []
            for a in SCALES:
                G = m.sample(5, random_state=1, cov_scale=a)
                r = [unfolding(g, lat[:, 0]) for g in G]
                d = [procrustes(m.lle_embedding_, g)[2] for g in G]
                cells.append(f"{np.mean(r):.3f}/{np.min(r):.3f}/{np.mean(d):.3f}")
            print(name, method, " ".join(cells), flush=True)


if __name__ == "__main__":
    main()
