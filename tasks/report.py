"""Summaries and the static report of a result store: PNG figures and one HTML page.

Figures: the best embedding of every model coloured by label (Poincare disc for hGP-LVM), the
bound over the grid as heat maps, ARD weights per view, GLLE generations.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr
from prefect import task

from tasks.store import METRICS, STATUS_DONE, STATUS_FAILED, open_results


def _groups(tree: xr.DataTree):
    for name, node in tree.children.items():
        if "status" in node.ds:
            yield name, node.ds


def best_point(ds: xr.Dataset) -> dict | None:
    """Sweep coordinates of the finished grid point with the highest bound."""
    elbo = ds["elbo"].where(ds["status"] == STATUS_DONE)
    if not np.isfinite(elbo.values).any():
        return None
    flat = int(np.nanargmax(elbo.values))
    idx = np.unravel_index(flat, elbo.shape)
    return {d: ds[d].values[i].item() for d, i in zip(elbo.dims, idx)}


def summary_table(store) -> pd.DataFrame:
    """One row per model: grid points done / failed, the best setting by the bound, its metrics."""
    tree = open_results(store)
    rows = []
    for name, ds in _groups(tree):
        st = ds["status"].values
        row = {
            "model": name,
            "done": int((st == STATUS_DONE).sum()),
            "failed": int((st == STATUS_FAILED).sum()),
            "total": int(st.size),
        }
        best = best_point(ds)
        if best is not None:
            cell = ds.sel(best)
            row["best"] = ", ".join(
                f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in best.items()
            )
            row["elbo"] = float(cell["elbo"])
            row["fit_s"] = float(cell["fit_seconds"])
            for m in METRICS:
                v = float(cell[m])
                if np.isfinite(v):
                    row[m] = v
        elif row["failed"]:
            errs = ds["error"].values[st == STATUS_FAILED]
            row["best"] = "all failed: " + str(errs.ravel()[0])[:80]
        rows.append(row)
    return pd.DataFrame(rows)


def _scatter(ax, X, c, title, hyperbolic):
    import matplotlib.pyplot as plt

    if X.shape[1] == 1:
        X = np.column_stack([X[:, 0], np.zeros(len(X))])
    ax.scatter(X[:, 0], X[:, 1], c=c, s=6, cmap="viridis" if c is not None else None, linewidths=0)
    if hyperbolic:
        ax.add_patch(plt.Circle((0, 0), 1.0, fill=False, color="k", lw=0.8))
        ax.set_xlim(-1.05, 1.05)
        ax.set_ylim(-1.05, 1.05)
    ax.set_aspect("equal", adjustable="datalim")
    ax.set_title(title, fontsize=8)
    ax.set_xticks([])
    ax.set_yticks([])


def _labels(store):
    from tasks.inputs import load_data
    from tasks.store import inputs_dir

    data_path = inputs_dir(store) / "data.zarr"
    if not data_path.exists():
        return None
    d = load_data(str(data_path))
    return d["label"] if d["label"] is not None else d["color"]


def make_report(store, out_dir=None) -> str:
    """Write PNG figures and ``index.html`` for the store; returns the HTML path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tasks.store import report_dir

    store = Path(store)
    out = Path(out_dir) if out_dir else report_dir(store)
    out.mkdir(parents=True, exist_ok=True)
    tree = open_results(store)
    colour = _labels(store)
    figs = []
    groups = list(_groups(tree))

    # 1. best embedding per model
    n = len(groups)
    cols = min(4, max(n, 1))
    rows = int(np.ceil(n / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.2 * rows), squeeze=False)
    for ax in axes.ravel():
        ax.axis("off")
    for ax, (name, ds) in zip(axes.ravel(), groups):
        best = best_point(ds)
        ax.axis("on")
        if best is None:
            ax.set_title(f"{name}: no finished grid point", fontsize=8)
            continue
        X = ds["embedding"].sel(best).values
        X = X[:, np.isfinite(X).all(axis=0)]
        hyper = bool(ds.attrs.get("hyperbolic_embedding", 0))
        desc = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in best.items())
        _scatter(ax, X, colour, f"{name}\n{desc}", hyper)
    fig.suptitle(
        "Best embedding per model (by the bound), coloured by label / manifold parameter", fontsize=9
    )
    fig.tight_layout()
    fig.savefig(out / "embeddings.png", dpi=110)
    plt.close(fig)
    figs.append(("embeddings.png", "Best embedding of every model"))

    # 2. bound over the grid
    for name, ds in groups:
        elbo = ds["elbo"].where(ds["status"] == STATUS_DONE)
        if "seed" in elbo.dims:
            elbo = elbo.mean("seed")
        varying = [d for d in elbo.dims if elbo.sizes[d] > 1]
        if not varying or not np.isfinite(elbo.values).any():
            continue
        fig, ax = plt.subplots(figsize=(4.2, 3.2))
        if len(varying) == 1:
            e = elbo.squeeze([d for d in elbo.dims if d not in varying])
            ax.plot(e[varying[0]].values, e.values, "o-")
            ax.set_xlabel(varying[0])
            ax.set_ylabel("bound (mean over seeds)")
        else:
            a, b = varying[:2]
            e = elbo.isel({d: 0 for d in elbo.dims if d not in (a, b)}).transpose(a, b)
            im = ax.imshow(e.values, aspect="auto", origin="lower", cmap="magma")
            ax.set_yticks(range(e.sizes[a]), [f"{v:g}" for v in e[a].values])
            ax.set_xticks(range(e.sizes[b]), [f"{v:g}" for v in e[b].values])
            ax.set_ylabel(a)
            ax.set_xlabel(b)
            fig.colorbar(im, ax=ax, label="bound")
        ax.set_title(f"{name}: bound over the grid", fontsize=9)
        fig.tight_layout()
        fig.savefig(out / f"bound_{name}.png", dpi=110)
        plt.close(fig)
        figs.append((f"bound_{name}.png", f"{name}: bound over the grid"))

    # 3. ARD weights
    for name, ds in groups:
        if "ard_weights" not in ds:
            continue
        best = best_point(ds)
        if best is None:
            continue
        W = np.atleast_2d(ds["ard_weights"].sel(best).values)
        W = W[:, np.isfinite(W).all(axis=0)]
        fig, ax = plt.subplots(figsize=(4.5, 3))
        width = 0.8 / W.shape[0]
        for v in range(W.shape[0]):
            w = W[v] / max(W[v].max(), 1e-300)
            ax.bar(np.arange(W.shape[1]) + v * width, w, width, label=f"view {v}" if W.shape[0] > 1 else None)
        ax.set_xlabel("latent dimension")
        ax.set_ylabel("normalised ARD weight")
        if W.shape[0] > 1:
            ax.legend(fontsize=7)
        ax.set_title(f"{name}: ARD weights per view (best fit)", fontsize=9)
        fig.tight_layout()
        fig.savefig(out / f"ard_{name}.png", dpi=110)
        plt.close(fig)
        figs.append((f"ard_{name}.png", f"{name}: ARD weights"))

    # 4. GLLE generations
    for name, ds in groups:
        if "generations" not in ds:
            continue
        best = best_point(ds)
        if best is None:
            continue
        G = ds["generations"].sel(best).values
        G = G[np.isfinite(G).all(axis=(1, 2))]
        if len(G) == 0:
            continue
        G = G[:, :, np.isfinite(G[0]).all(axis=0)]
        fig, axes = plt.subplots(1, len(G), figsize=(2.6 * len(G), 2.6), squeeze=False)
        for g, ax in enumerate(axes[0]):
            _scatter(ax, G[g], colour, f"generation {g}", False)
        fig.suptitle(f"{name}: generations from one fit", fontsize=9)
        fig.tight_layout()
        fig.savefig(out / f"generations_{name}.png", dpi=110)
        plt.close(fig)
        figs.append((f"generations_{name}.png", f"{name}: generations"))

    # 5. hGP-LVM kappa study (paper 002 figure 4b): the best fit at each kappa, on the Poincare disc
    kgroups = [(n, ds) for n, ds in groups if "kappa" in ds.dims and ds.sizes["kappa"] > 1]
    if kgroups:
        kappas = kgroups[0][1]["kappa"].values
        fig, axes = plt.subplots(
            len(kgroups), len(kappas), figsize=(2.6 * len(kappas), 2.6 * len(kgroups)), squeeze=False
        )
        for r, (name, ds) in enumerate(kgroups):
            for c, kap in enumerate(ds["kappa"].values):
                sub = ds.sel(kappa=kap)
                best = best_point(sub)
                if best is None:
                    axes[r, c].set_axis_off()
                    continue
                E = sub["embedding"].sel(best).values
                E = E[:, np.isfinite(E).all(axis=0)]
                _scatter(axes[r, c], E, colour, f"{name}, kappa = {kap:g}", True)
        fig.suptitle("hGP-LVM: length scale kappa (rows: variants; columns: kappa)", fontsize=9)
        fig.tight_layout()
        fig.savefig(out / "hgplvm_kappa.png", dpi=110)
        plt.close(fig)
        figs.append(("hgplvm_kappa.png", "hGP-LVM kappa study"))

    # 6. GLLE covariance-scale study (paper 001 section VI-C): one generation per scale a
    studies = [(n, ds) for n, ds in groups if "scale_study" in ds and best_point(ds) is not None]
    if studies:
        scales = studies[0][1]["cov_scale"].values
        fig, axes = plt.subplots(
            len(studies), len(scales), figsize=(2.4 * len(scales), 2.4 * len(studies)), squeeze=False
        )
        for r, (name, ds) in enumerate(studies):
            G = ds["scale_study"].sel(best_point(ds)).values
            for c, a in enumerate(scales):
                E = G[c][:, np.isfinite(G[c]).all(axis=0)]
                if E.shape[1] >= 2 and np.isfinite(E).all():
                    _scatter(axes[r, c], E, colour, f"{name}, a = {a:g}", False)
                else:
                    axes[r, c].set_axis_off()
        fig.suptitle("GLLE: covariance scale a (rows: variants; columns: a)", fontsize=9)
        fig.tight_layout()
        fig.savefig(out / "glle_cov_scale.png", dpi=110)
        plt.close(fig)
        figs.append(("glle_cov_scale.png", "GLLE covariance-scale study"))

    table = summary_table(store)
    ident = json.loads(tree.attrs.get("identity", "{}"))
    body = [
        "<html><head><meta charset='utf-8'><title>embed-sweep report</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:3px 6px;font-size:12px}img{max-width:100%}</style></head><body>",
        f"<h1>embed-sweep report</h1><p>store: <code>{html.escape(str(store))}</code>; "
        f"dataset: <code>{html.escape(json.dumps(ident.get('dataset')))}</code>; "
        f"grid: <code>{html.escape(json.dumps(ident.get('grid')))}</code></p>",
        "<h2>Summary (best setting per model by the bound)</h2>",
        table.to_html(index=False, float_format=lambda v: f"{v:.4g}", na_rep=""),
    ]
    for fname, caption in figs:
        body.append(f"<h3>{html.escape(caption)}</h3><img src='{fname}'>")
    body.append("</body></html>")
    (out / "index.html").write_text("\n".join(body))
    return str(out / "index.html")


@task(name="report", retries=1)
def report_task(store: str) -> str:
    return make_report(store)
