"""Summaries and the static report of a result store: PNG figures and one HTML page.

Figures, each captioned with what it shows and the setting: the chosen embedding of every model
(Poincare disc for hGP-LVM) coloured by the data's colour column or labels, with a legend of the
category names (:func:`colouring`), and its posterior uncertainty where the model has one
(``embedding_var``: 1-sd ellipses); per model, the bound and the quality metrics against every
swept setting in ascending order of its values (whatever order a grown store holds them in), and
for 2-D grids a heat map of the selection criterion; ARD weights per view;
GLLE generations and covariance-scale study; the hGP-LVM kappa study. "Best" is chosen per model
by tasks.results (the bound where it is comparable, the geodesic agreement where it is not); the
summary says which criterion chose it.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from tasks.results.extras import extras_settings
from tasks.results.models import model_sizes
from tasks.results.selection import QUALITY, criterion_of, model_groups, quality_grid, select
from tasks.store import STATUS_DONE, open_results

#: the per-model metric-versus-setting plots (those present in the store are drawn)
#: posterior ellipses drawn per embedding panel (a fixed random subset of the points)
ELLIPSES = 40
CURVES = ("elbo", QUALITY, "trustworthiness", "continuity", "distance_correlation", "knn_accuracy")


def _fmt(setting: dict) -> str:
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in setting.items())


def best_point(ds: xr.Dataset) -> dict | None:
    """Sweep coordinates of the finished grid point with the highest bound (the bound alone; the
    sweep's choice of "best" is tasks.results.select)."""
    elbo = ds["elbo"].where(ds["status"] == STATUS_DONE)
    if not np.isfinite(elbo.values).any():
        return None
    idx = np.unravel_index(int(np.nanargmax(elbo.values)), elbo.shape)
    return {d: ds[d].values[i].item() for d, i in zip(elbo.dims, idx)}


def summary_table(store) -> pd.DataFrame:
    """One row per model: grid points done / failed, the chosen setting, the criterion that chose
    it ("chosen by"), its bound and metrics, and the size of its kept fitted models ("model MiB per
    point": the median over the points that keep one; issue 50)."""
    from tasks.results.selection import summary_rows

    table = pd.DataFrame(summary_rows(store))
    sizes = model_sizes(store)
    if sizes and "model" in table:
        table["model MiB per point"] = [sizes[m][0] / 2**20 if m in sizes else np.nan for m in table["model"]]
    return table


def _scatter(ax, X, c, title, hyperbolic, var=None):
    import matplotlib.pyplot as plt
    from matplotlib.collections import EllipseCollection

    if X.shape[1] == 1:
        X = np.column_stack([X[:, 0], np.zeros(len(X))])
        var = None if var is None else np.column_stack([var[:, 0], np.zeros(len(var))])
    cmap = None
    if c is not None and np.ndim(c) == 1:  # numbers on viridis (NaN: light grey); else RGBA rows
        import matplotlib

        cmap = matplotlib.colormaps["viridis"].with_extremes(bad=(0.82, 0.82, 0.82, 1.0))
    ax.scatter(X[:, 0], X[:, 1], c=c, s=6, cmap=cmap, plotnonfinite=cmap is not None, linewidths=0)
    if hyperbolic:
        ax.add_patch(plt.Circle((0, 0), 1.0, fill=False, color="k", lw=0.8))
        lims = (-1.05, 1.05), (-1.05, 1.05)
    elif var is not None:  # the limits are those of the points, so wide posteriors leave the panel
        lo, hi = X[:, :2].min(axis=0), X[:, :2].max(axis=0)
        pad = 0.05 * np.maximum(hi - lo, 1e-12)
        lims = (lo[0] - pad[0], hi[0] + pad[0]), (lo[1] - pad[1], hi[1] + pad[1])
    else:
        lims = None
    if lims is not None:  # fixed limits: an equal aspect must adapt the box, not the limits
        ax.set_xlim(*lims[0])
        ax.set_ylim(*lims[1])
        ax.set_aspect("equal", adjustable="box")
    else:
        ax.set_aspect("equal", adjustable="datalim")
    if var is not None and var.shape[1] >= 2:
        # 1-sd ellipses of a fixed random subset of the points (all of them hide the points)
        pick = np.random.default_rng(0).choice(len(X), min(ELLIPSES, len(X)), replace=False)
        sd = np.sqrt(np.clip(var[pick, :2], 0, None))
        ax.add_collection(
            EllipseCollection(
                2 * sd[:, 0],
                2 * sd[:, 1],
                np.zeros(len(pick)),
                units="xy",
                offsets=X[pick, :2],
                offset_transform=ax.transData,
                facecolors="none",
                edgecolors=(0.85, 0.2, 0.2, 0.6),
                linewidths=0.6,
            ),
            autolim=False,
        )
    ax.set_title(title, fontsize=8)
    ax.set_xticks([])
    ax.set_yticks([])


def _by_grid(ds: xr.Dataset) -> xr.Dataset:
    """The group with every sweep dimension in ascending order of its values: a grown store
    appends new values at the end (k = 8, then 6 and 10), and curves and heat maps drawn in
    storage order would join the points out of order."""
    dims = [d for d in ds["status"].dims if ds.sizes[d] > 1]
    return ds.sortby(dims) if dims else ds


def colouring(store) -> dict | None:
    """What the report colours points by, from the store's ingested data:
    ``{"values", "names", "title"}``. ``values``: one number per point (NaN: no value); ``names``:
    category names for a categorical colour (``values`` are then codes into it), else None.

    The data's ``color_column`` when it named one (an ``obs`` column of an AnnData, a column of
    a CSV), else its labels (``label_column``, or a named set's classes) by their category names,
    else the manifold parameter of a named set. None when the data is not beside the store."""
    from lvmcore.checks import MISSING_LABEL
    from lvmcore.data import color_names, label_names
    from tasks.inputs import load_data
    from tasks.store import inputs_dir

    data_path = inputs_dir(store) / "data.zarr"
    if not data_path.exists():
        return None
    d = load_data(str(data_path))
    attrs = json.loads((data_path / "zarr.json").read_text()).get("attributes", {})
    color_column = attrs.get("color_column")
    if d["color"] is not None and color_column:
        return {
            "values": np.asarray(d["color"], dtype=np.float64),
            "names": color_names(str(data_path)),
            "title": str(color_column),
        }
    if d["label"] is not None:
        codes = np.asarray(d["label"]).astype(np.float64)
        codes[codes == MISSING_LABEL] = np.nan
        names = label_names(str(data_path))
        if names is None:  # a data set without names for its classes: the codes are the names
            names = [str(i) for i in range(int(np.nanmax(codes)) + 1 if np.isfinite(codes).any() else 0)]
        return {"values": codes, "names": names, "title": str(attrs.get("label_column") or "label")}
    if d["color"] is not None:
        return {
            "values": np.asarray(d["color"], dtype=np.float64),
            "names": None,
            "title": "manifold parameter",
        }
    return None


#: categorical colours: up to this many categories get a legend entry each
LEGEND_MAX = 30


def _point_colours(col: dict | None):
    """``c`` for :func:`_scatter`: RGBA rows for a categorical colour (tab10 / tab20, light grey
    where a point has no value), the values themselves for a numeric one (viridis)."""
    if col is None:
        return None
    if col["names"] is None:
        return col["values"]
    return _category_rgba(col["values"], len(col["names"]))


def _category_rgba(codes, n_names: int) -> np.ndarray:
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if n_names <= 10 else "tab20"]
    rgba = np.tile(np.array([0.82, 0.82, 0.82, 1.0]), (len(codes), 1))
    ok = np.isfinite(codes)
    rgba[ok] = cmap(np.asarray(codes[ok], dtype=np.int64) % cmap.N)
    return rgba


def _legend(fig, col: dict | None) -> str:
    """A legend of the category names below the figure; returns the caption's words about the colour."""
    if col is None:
        return "uncoloured (the data has no labels or colour column)"
    if col["names"] is None:
        return f"coloured by {col['title']} (viridis: low dark, high yellow)"
    from matplotlib.lines import Line2D

    names = col["names"]
    rgba = _category_rgba(np.arange(len(names), dtype=np.float64), len(names))
    shown = names[:LEGEND_MAX]
    handles = [
        Line2D([], [], marker="o", ls="", color=rgba[i], ms=5, label=name) for i, name in enumerate(shown)
    ]
    if np.isnan(col["values"]).any():
        handles.append(Line2D([], [], marker="o", ls="", color=(0.82, 0.82, 0.82), ms=5, label="(none)"))
    fig.legend(
        handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(6, len(handles)),
        fontsize=7, frameon=False, title=col["title"], title_fontsize=8,
    )  # fmt: skip
    more = (
        f" (the first {LEGEND_MAX} of {len(names)} categories in the legend)"
        if len(names) > LEGEND_MAX
        else ""
    )
    return f"coloured by {col['title']}{more}; light grey: no value"


def _metric_curves(plt, ds, qual, name, crit, chosen, out):
    """Per-model metrics against each swept dimension (mean over seeds, every seed as a dot);
    a heat map of the criterion when two dimensions besides seed vary. Returns (file, caption)s."""
    done = ds["status"] == STATUS_DONE
    series = {m: ds[m].where(done) for m in CURVES if m in ds and m != QUALITY}
    if qual is not None:
        series[QUALITY] = qual
    series = {m: v for m, v in series.items() if np.isfinite(v.values).any()}
    varying = [d for d in ds["status"].dims if ds.sizes[d] > 1 and d != "seed"]
    figs = []
    if not varying or not series:
        return figs
    at = {d: chosen[d] for d in ds["status"].dims if d != "seed"}
    for dim in varying:
        fig, axes = plt.subplots(1, len(series), figsize=(2.5 * len(series), 2.5), squeeze=False)
        for ax, (m, v) in zip(axes[0], series.items()):
            other = {d: at[d] for d in v.dims if d not in (dim, "seed")}
            line = v.sel(other)
            x = line[dim].values
            if "seed" in line.dims:
                for s in line["seed"].values:
                    ax.plot(x, line.sel(seed=s).values, ".", color="0.6", ms=4)
                line = line.mean("seed")
            ax.plot(x, line.values, "o-", ms=4)
            if dim == "kappa":
                ax.set_xscale("log")
            ax.set_xlabel(dim)
            ax.set_title(m.replace("_", " "), fontsize=8)
            ax.tick_params(labelsize=7)
        fig.tight_layout()
        fname = f"curves_{name}_{dim}.png"
        fig.savefig(out / fname, dpi=100)
        plt.close(fig)
        fixed = _fmt({d: v for d, v in at.items() if d != dim})
        figs.append(
            (
                fname,
                f"{name}: bound and metrics against {dim} (mean over seeds, grey dots: single seeds"
                + (f"; other dimensions at {fixed}" if fixed else "")
                + f"). Chosen setting {_fmt(chosen)}, by {crit['text']}.",
            )
        )
    if len(varying) >= 2:
        a, b = varying[:2]
        key = QUALITY if crit["by_quality"] and QUALITY in series else "elbo"
        v = series[key]
        if "seed" in v.dims:
            v = v.mean("seed")
        v = v.sel({d: at[d] for d in v.dims if d not in (a, b)}).transpose(a, b)
        fig, ax = plt.subplots(figsize=(4.2, 3.2))
        im = ax.imshow(v.values, aspect="auto", origin="lower", cmap="magma")
        ax.set_yticks(range(v.sizes[a]), [f"{x:g}" for x in v[a].values])
        ax.set_xticks(range(v.sizes[b]), [f"{x:g}" for x in v[b].values])
        ax.set_ylabel(a)
        ax.set_xlabel(b)
        ia = list(v[a].values).index(at[a])
        ib = list(v[b].values).index(at[b])
        ax.plot([ib], [ia], "c*", ms=12)
        fig.colorbar(im, ax=ax, label=key.replace("_", " "))
        fig.tight_layout()
        fname = f"heatmap_{name}.png"
        fig.savefig(out / fname, dpi=100)
        plt.close(fig)
        figs.append(
            (
                fname,
                f"{name}: {key.replace('_', ' ')} (the selection criterion) over {a} x {b}, mean over "
                f"seeds; the star marks the chosen setting ({_fmt(chosen)}).",
            )
        )
    return figs


def extras_notes(groups, chosen: dict) -> list[str]:
    """One line per model group that holds GLLE's diagnostics (generations and covariance-scale
    study): at which of its finished grid points they were computed, and whether the chosen setting
    is one of them (a sweep computes them for the chosen setting unless run with extras "all")."""
    lines = []
    for name, ds in groups:
        settings = extras_settings(ds)
        if settings is None:
            continue
        n_done = int((ds["status"].values == STATUS_DONE).sum())
        pick = chosen[name].get("setting")
        at = "; ".join(_fmt(s) for s in settings[:6]) + (
            f"; and {len(settings) - 6} more" if len(settings) > 6 else ""
        )
        line = (
            f"{name}: generations and covariance-scale study at {len(settings)} of {n_done} finished point(s)"
        )
        line += f" ({at})" if settings else ""
        if pick is not None:
            line += (
                "; the chosen setting carries them"
                if pick in settings
                else f"; the chosen setting ({_fmt(pick)}) has none yet: the sweep run again adds them"
            )
        lines.append(line + ".")
    return lines


def components_notes(groups, chosen: dict) -> list[str]:
    """One line per graph model (GLLE, LL-LVM) whose chosen setting's neighbour graph fell into
    several connected components (``n_components_graph`` > 1): each component was fitted as its own
    problem and the pieces placed side by side in one layout (lvmcore.models.components), so their
    relative position and scale are arbitrary, as in UMAP's layout of components."""
    lines = []
    for name, ds in groups:
        pick = chosen[name].get("setting")
        if "n_components_graph" not in ds or pick is None:
            continue
        at = {d: v for d, v in pick.items() if d in ds["n_components_graph"].dims}
        n = float(ds["n_components_graph"].sel(at).values)
        if not np.isfinite(n) or n <= 1:
            continue
        lines.append(
            f"{name}: at the chosen setting ({_fmt(pick)}) the neighbour graph has {int(n)} connected "
            "components; each was fitted alone and the pieces were placed side by side in one layout, so "
            "their positions and scales relative to each other are arbitrary (distances and the metrics "
            "hold within a component; the metrics are their size-weighted mean)."
        )
    return lines


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
    col = colouring(store)
    colour = _point_colours(col)
    figs = []
    groups = [(name, _by_grid(ds)) for name, ds in model_groups(tree).items()]
    chosen = {name: select(store, name) for name, _ in groups}

    # 1. chosen embedding per model, with posterior uncertainty where the model has it
    n = len(groups)
    cols = min(4, max(n, 1))
    rows = int(np.ceil(n / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.4 * rows), squeeze=False)
    for ax in axes.ravel():
        ax.axis("off")
    with_var, tangent_var = [], []
    for ax, (name, _ds) in zip(axes.ravel(), groups):
        sel = chosen[name]
        ax.axis("on")
        if sel["setting"] is None:
            ax.set_title(f"{name}: no finished grid point", fontsize=8)
            continue
        var = None if sel["hyperbolic"] else sel["embedding_var"]
        if var is not None:
            with_var.append(name)
        elif sel["hyperbolic"] and sel["embedding_var"] is not None:
            tangent_var.append(name)
        _scatter(ax, sel["embedding"], colour, f"{name}\n{_fmt(sel['setting'])}", sel["hyperbolic"], var)
    fig.tight_layout()
    coloured = _legend(fig, col)
    fig.savefig(out / "embeddings.png", dpi=110, bbox_inches="tight")  # "tight": the legend below
    plt.close(fig)
    figs.append(
        (
            "embeddings.png",
            "Chosen embedding of every model (setting above each panel; criterion in the summary), "
            f"{coloured}; hGP-LVM on the Poincare disc. "
            + (
                f"Red ellipses: one posterior standard deviation (embedding_var) of {ELLIPSES} points "
                f"({', '.join(with_var)})."
                if with_var
                else "No Euclidean embedding here has posterior variances."
            )
            + (
                f" The posterior variances of {', '.join(tangent_var)} live on the hyperboloid's tangent "
                "space and are not drawn on the disc (they are in the store and the export)."
                if tangent_var
                else ""
            ),
        )
    )

    # 2. bound and metrics against every swept setting; heat map of the criterion on 2-D grids
    for name, ds in groups:
        sel = chosen[name]
        if sel["setting"] is None:
            continue
        crit = criterion_of(ds, name)
        varying = [d for d in ds["status"].dims if ds.sizes[d] > 1 and d != "seed"]
        qual = quality_grid(ds, store) if varying else None
        figs += _metric_curves(plt, ds, qual, name, crit, sel["setting"], out)

    # 3. ARD weights
    for name, ds in groups:
        if "ard_weights" not in ds or chosen[name]["setting"] is None:
            continue
        setting = chosen[name]["setting"]
        W = np.atleast_2d(ds["ard_weights"].sel(setting).values)
        W = W[:, np.isfinite(W).all(axis=0)]
        fig, ax = plt.subplots(figsize=(1.2 + 0.5 * W.shape[1] * W.shape[0] ** 0.5, 2.6))
        width = 0.8 / W.shape[0]
        for v in range(W.shape[0]):
            w = W[v] / max(W[v].max(), 1e-300)
            ax.bar(np.arange(W.shape[1]) + v * width, w, width, label=f"view {v}" if W.shape[0] > 1 else None)
        ax.set_xticks(np.arange(W.shape[1]) + 0.4 - width / 2, [str(q) for q in range(W.shape[1])])
        ax.set_xlabel("latent dimension")
        ax.set_ylabel("normalised ARD weight")
        if W.shape[0] > 1:
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"ard_{name}.png", dpi=110)
        plt.close(fig)
        figs.append(
            (
                f"ard_{name}.png",
                f"{name}: ARD weights per latent dimension"
                + (" and view" if W.shape[0] > 1 else "")
                + f", each view's scaled to its largest ({_fmt(setting)}).",
            )
        )

    # 4. GLLE generations
    for name, ds in groups:
        if "generations" not in ds or chosen[name]["setting"] is None:
            continue
        setting = chosen[name]["setting"]
        G = ds["generations"].sel(setting).values
        G = G[np.isfinite(G).all(axis=(1, 2))]
        if len(G) == 0:
            continue
        G = G[:, :, np.isfinite(G[0]).all(axis=0)]
        fig, axes = plt.subplots(1, len(G), figsize=(2.6 * len(G), 2.6), squeeze=False)
        for g, ax in enumerate(axes[0]):
            _scatter(ax, G[g], colour, f"generation {g}", False)
        fig.tight_layout()
        fig.savefig(out / f"generations_{name}.png", dpi=110)
        plt.close(fig)
        figs.append(
            (
                f"generations_{name}.png",
                f"{name}: {len(G)} embeddings sampled from one fit's posterior (paper 001), "
                f"coloured as above ({_fmt(setting)}: the chosen setting).",
            )
        )

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
        fig.tight_layout()
        fig.savefig(out / "hgplvm_kappa.png", dpi=110)
        plt.close(fig)
        others = {d: ds[d].values.tolist() for d in kgroups[0][1]["status"].dims if d != "kappa"}
        figs.append(
            (
                "hgplvm_kappa.png",
                "hGP-LVM on the Poincare disc for each length scale kappa (paper 002, fig. 4b): rows are "
                f"variants, columns kappa; in each cell the highest bound over {others}.",
            )
        )

    # 6. GLLE covariance-scale study (paper 001 section VI-C): one generation per scale a
    studies = [(n, ds) for n, ds in groups if "scale_study" in ds and chosen[n]["setting"] is not None]
    if studies:
        scales = studies[0][1]["cov_scale"].values
        fig, axes = plt.subplots(
            len(studies), len(scales), figsize=(2.4 * len(scales), 2.4 * len(studies)), squeeze=False
        )
        for r, (name, ds) in enumerate(studies):
            G = ds["scale_study"].sel(chosen[name]["setting"]).values
            for c, a in enumerate(scales):
                E = G[c][:, np.isfinite(G[c]).all(axis=0)]
                if E.shape[1] >= 2 and np.isfinite(E).all():
                    _scatter(axes[r, c], E, colour, f"{name}, a = {a:g}", False)
                else:
                    axes[r, c].set_axis_off()
        fig.tight_layout()
        fig.savefig(out / "glle_cov_scale.png", dpi=110)
        plt.close(fig)
        where = "; ".join(f"{n}: {_fmt(chosen[n]['setting'])}" for n, _ in studies)
        figs.append(
            (
                "glle_cov_scale.png",
                "GLLE generations with the posterior covariance scaled by a (paper 001, section VI-C): "
                f"rows are variants, columns a ({where}).",
            )
        )

    table = summary_table(store)
    ident = json.loads(tree.attrs.get("identity", "{}"))
    body = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>embed-sweep report</title>",
        "<style>body{font-family:sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:3px 6px;font-size:12px}img{max-width:100%}"
        "figure{margin:1.5em 0}figcaption{font-size:13px;color:#333;max-width:60em}</style></head><body>",
        f"<h1>embed-sweep report</h1><p>store: <code>{html.escape(str(store))}</code>; "
        f"dataset: <code>{html.escape(json.dumps(ident.get('dataset')))}</code>; "
        f"grid: <code>{html.escape(json.dumps(ident.get('grid')))}</code></p>",
        "<h2>Summary</h2><p>One row per model: the chosen setting and the criterion that chose it. The "
        "bound chooses along the sweep dimensions where it is comparable; along the others (for example "
        "GLLE's k, where the likelihood grows with k) the geodesic agreement does: the Spearman "
        "correlation of embedding distances with the shortest-path distances of the data's kNN graph "
        "(the smallest k that connects it).</p>",
        table.to_html(index=False, float_format=lambda v: f"{v:.4g}", na_rep=""),
    ]
    notes = extras_notes(groups, chosen)
    if notes:  # which points carry GLLE's diagnostics (tasks.results.extras)
        body.append("<p>" + "<br>".join(html.escape(n) for n in notes) + "</p>")
    components = components_notes(groups, chosen)
    if components:  # graph models fitted per connected component (lvmcore.models.components)
        body.append("<p>" + "<br>".join(html.escape(n) for n in components) + "</p>")
    for fname, caption in figs:
        body.append(
            f"<figure><img src='{html.escape(fname)}' alt='{html.escape(caption)}'>"
            f"<figcaption>{html.escape(caption)}</figcaption></figure>"
        )
    body.append("</body></html>")
    (out / "index.html").write_text("\n".join(body))
    return str(out / "index.html")
