"""hGP-LVM point / sparse convergence probe (issue 24): one fit with a trace of the objective's
window means, sigma, the largest latent radius and the score, for comparing likelihood settings.

    python -m bench.hgplvm.convergence --data 4 --seed 0 [--variant point] [--max-iter 6000]
                                [--kw '{"mean": "integrated"}'] [--every 250] [--json out.json]

--kw: constructor overrides (JSON).  Printed every
--every iterations (live): sigma, max tangent radius, score (trees: Pearson correlation of the
hyperbolic latent distances with the Hamming distances; myeloid: Qlocal / Qglobal); after the
fit: the objective's means over windows of --every iterations, n_iter and whether the convergence
rule stopped it.
"""


import argparse
import json
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="4")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variant", default="point")
    ap.add_argument("--max-iter", type=int, default=6000)
    ap.add_argument("--kw", default="{}")
    ap.add_argument("--every", type=int, default=250)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    from bench.hgplvm.authors import load  # the data and their scorer, as the anchor uses them
    from lvmcore.models.hgplvm import HyperboloidGPLVM
    from lvmcore.models.hgplvm.objectives import renorm

    Y, scorer = load(a.data if a.data == "myeloid" else f"tree{a.data}", a.seed)

    def score(X):
        sc = [round(float(x), 4) for x in scorer(X)]
        return sc if a.data == "myeloid" else sc[0]

    rows = []
    t0 = time.perf_counter()

    def monitor(it, st):
        if it % a.every == 0:
            X = np.asarray(renorm(st["X"]))  # st: the fit's callback state (NumPy)
            sig = float(np.exp(np.asarray(st["hyp"])[0]))
            r = float(np.arccosh(np.maximum(X[:, 0], 1.0)).max())
            sc = score(X)
            rows.append({"it": it, "sigma": sig, "rmax": r, "score": sc, "t": time.perf_counter() - t0})
            dt = time.perf_counter() - t0
            print(f"  it {it:5d} sigma {sig:.3f} rmax {r:.2f} score {sc} ({dt:.0f} s)", flush=True)

    kw = json.loads(a.kw)
    if "_drift_every" in kw:  # the earlier name of the switch
        kw["drift_every"] = kw.pop("_drift_every")
    params = dict(n_components=2, kappa=100.0, variant=a.variant, max_iter=a.max_iter, random_state=a.seed)
    m = HyperboloidGPLVM(**{**params, **kw}).fit(Y, callback=monitor)
    tr = m.elbo_trace_
    w = a.every
    wm = [float(np.mean(tr[i : i + w])) for i in range(0, len(tr) - w + 1, w)]
    final = score(m.lorentz_embedding_)
    if m.drift_moves_:
        print("drift moves (it:a): " + " ".join(f"{i}:{x:g}" for i, x in m.drift_moves_))
    print(f"window means ({w} it): " + " ".join(f"{x:.1f}" for x in wm))
    print(
        f"data {a.data} seed {a.seed} {a.variant} kw={a.kw}: n_iter {m.n_iter_} "
        f"converged {m.converged_} score {final} sigma {m.sigma_:.3f} objective {m.elbo_:.2f} "
        f"fit {m.fit_time_:.1f} s"
    )
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(
                {"args": vars(a), "rows": rows, "window_means": wm,
                 "means25": [float(np.mean(tr[i : i + 25])) for i in range(0, len(tr) - 24, 25)],
                 "n_iter": m.n_iter_,
                 "converged": m.converged_, "score": final, "sigma": m.sigma_, "fit_s": m.fit_time_},
                fh,
            )  # fmt: skip


if __name__ == "__main__":
    main()
