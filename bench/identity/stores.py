"""Numerics unchanged across a restructuring: run the same sweeps with two checkouts of the code
and compare every array of their result stores.

The sweeps are the main job's four (``embed-sweep run``) plus three that reach the data, model
and store paths the main job does not: scanpy's ``pbmc68k_reduced.h5ad`` with streamed
preprocessing (PCA on scanpy's default genes, and on every gene), a two-modality ``.h5mu`` through
MRD and PPCA, and a minibatch Bayesian hGP-LVM.

    python bench/identity/stores.py prepare DIR                 # the inputs and the --config file
    python bench/identity/stores.py run CODE DIR/OUT            # the sweeps with the code at CODE
    python bench/identity/stores.py compare DIR/OUT_A DIR/OUT_B # every array, every attribute

``run`` puts CODE first on PYTHONPATH (the flow process and the Dask workers alike), so two
checkouts (``git worktree add``) run with one virtual environment. ``compare`` reports each array
that differs (max absolute difference) and each attribute that differs, except the names in
``VOLATILE``: values that change on every run by design (times, provenance stamps).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

#: arrays and attributes that change on every run by design: wall times, the run's provenance
VOLATILE = (
    "fit_seconds",
    "time",
    "created",
    "started",
    "finished",
    "host",
    "pid",
    "run_id",
    "duration",
    "wall",
    # a hash of the numerics source files (tasks.store.fingerprint.numerics_version): changes with
    # every edit of those files by design, so a restructuring changes it while the numbers stay
    "numerics",
)


def prepare(root: Path) -> None:
    import anndata as ad
    import mudata
    import scanpy as sc

    root.mkdir(parents=True, exist_ok=True)
    src = Path(sc.__file__).parent / "datasets" / "10x_pbmc68k_reduced.h5ad"
    shutil.copy(src, root / "pbmc68k_reduced.h5ad")
    rng = np.random.default_rng(0)
    n, q = 150, 3
    z = rng.standard_normal((n, q))
    rna = rng.poisson(np.exp(0.5 * z @ rng.standard_normal((q, 40)))).astype(np.float32)
    prot = (np.tanh(z @ rng.standard_normal((q, 12))) + 0.1 * rng.standard_normal((n, 12))).astype(np.float32)
    names = [f"cell{i}" for i in range(n)]
    a = ad.AnnData(X=rna)
    b = ad.AnnData(X=prot)
    a.obs_names = b.obs_names = names
    a.var_names = [f"gene{i}" for i in range(40)]
    b.var_names = [f"protein{i}" for i in range(12)]
    mudata.MuData({"rna": a, "prot": b}).write(str(root / "cite.h5mu"))
    pbmc = str(root / "pbmc68k_reduced.h5ad")
    sweeps = [
        {
            "dataset": {"path": pbmc, "preprocess": {"pca": 10}, "label_column": "bulk_labels"},
            "models": ["ppca", "glle", "bgplvm"],
            "grid": {"k": [10], "latent_dim": [2], "seed": [0]},
            "store": "pbmc_hvg.zarr",
            "model_options": {"bgplvm": {"max_iter": 100, "n_inducing": 20}},
        },
        {
            "dataset": {
                "path": pbmc,
                "preprocess": {"pca": 10, "mask_var": None},
                "label_column": "bulk_labels",
            },
            "models": ["ppca", "glle"],
            "grid": {"k": [10], "latent_dim": [2], "seed": [0]},
            "store": "pbmc_all.zarr",
        },
        {
            "dataset": {
                "path": str(root / "cite.h5mu"),
                "modalities": {"rna": {"preprocess": {"log1p": True}}, "prot": {}},
            },
            "models": ["mrd", "ppca"],
            "grid": {"latent_dim": [3], "seed": [0]},
            "store": "cite.zarr",
            "model_options": {"mrd": {"kernel": "rbf", "max_iter": 200, "n_inducing": 15}},
        },
        {
            "dataset": {"name": "swiss_roll", "n": 300, "seed": 1},
            "models": ["hgplvm_bayesian"],
            "grid": {"latent_dim": [2], "kappa": [30.0], "seed": [0]},
            "store": "roll_minibatch.zarr",
            "model_options": {
                "hgplvm_bayesian": {"training": "minibatch", "batch_size": 100, "max_iter": 60}
            },
        },
    ]
    (root / "extra.json").write_text(json.dumps({"sweeps": sweeps}, indent=1))
    print(f"inputs and {root / 'extra.json'} written")


def run(code: Path, out: Path, config: Path, extra_args=()) -> None:
    env = dict(os.environ, PYTHONPATH=str(code))
    py = [sys.executable, "-c", "import sys; from flows.cli import main; sys.exit(main())"]
    for extra in ([], ["--config", str(config)]):
        cmd = py + ["run", "--replace", "--out", str(out), *extra, *extra_args]
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, cwd=code, env=env, check=True)


def _volatile(name: str) -> bool:
    return any(v in name.lower() for v in VOLATILE)


def _arrays(store: Path) -> dict[str, tuple[np.ndarray, dict]]:
    import zarr

    out = {}
    root = zarr.open_group(str(store), mode="r")

    def walk(group, prefix):
        out[prefix + "/.attrs"] = (None, dict(group.attrs))
        for name, arr in group.arrays():
            out[f"{prefix}/{name}"] = (arr[...], dict(arr.attrs))
        for name, sub in group.groups():
            walk(sub, f"{prefix}/{name}")

    walk(root, "")
    return out


def _same(a, b) -> tuple[bool, str]:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False, f"shape/dtype {a.shape} {a.dtype} vs {b.shape} {b.dtype}"
    if a.dtype.kind in "fc":
        same = np.array_equal(a, b, equal_nan=True)
        if not same:
            d = np.nanmax(np.abs(a.astype(complex if a.dtype.kind == "c" else float) - b))
            return False, f"max |diff| {d:.3g}"
        return True, ""
    return bool(np.array_equal(a, b)), "values differ"


def _strip(attrs: dict) -> dict:
    """Attributes without the volatile ones, JSON-valued attributes parsed and stripped alike."""
    out = {}
    for k, v in attrs.items():
        if _volatile(k):
            continue
        if isinstance(v, str) and v[:1] in "{[":
            try:
                v = _strip_json(json.loads(v))
            except ValueError:
                pass
        out[k] = v
    return out


def _strip_json(v):
    if isinstance(v, dict):
        return {k: _strip_json(x) for k, x in v.items() if not _volatile(k)}
    if isinstance(v, list):
        return [_strip_json(x) for x in v]
    return v


def compare(a: Path, b: Path) -> int:
    """Each store's arrays and attributes in ``a`` against ``b``: what changed or went (each named),
    and what is new in ``b`` (counted: a later version may add arrays, never change the old)."""
    stores = sorted(p.name for p in a.glob("*.zarr"))
    missing = sorted({p.name for p in b.glob("*.zarr")} ^ set(stores))
    bad = 0
    if missing:
        print("stores in one run only:", missing)
        bad += len(missing)
    for name in stores:
        if not (b / name).exists():
            continue
        A, B = _arrays(a / name), _arrays(b / name)
        diffs, added = [], []
        for key in sorted(set(A) | set(B)):
            if key not in B:
                diffs.append(f"{key}: gone")
                continue
            if key not in A:
                added.append(key)
                continue
            (xa, aa), (xb, ab) = A[key], B[key]
            if xa is not None and not _volatile(key.rsplit("/", 1)[-1]):
                ok, why = _same(xa, xb)
                if not ok:
                    diffs.append(f"{key}: {why}")
            sa, sb = _strip(aa), _strip(ab)
            for k in sorted(set(sa) | set(sb)):
                if k not in sa:
                    added.append(f"{key} attr {k}")
                elif sa.get(k) != sb.get(k):
                    diffs.append(f"{key} attr {k!r}: {str(sa.get(k))[:100]!r} vs {str(sb.get(k))[:100]!r}")
        n_arr = sum(1 for k, (x, _) in A.items() if x is not None)
        n_new = sum(1 for k in added if " attr " not in k and not k.endswith(".attrs"))
        print(
            f"{name}: {n_arr} arrays compared, {len(diffs)} differences; new in the second: {n_new} arrays, "
            f"{len(added) - n_new} groups/attributes"
        )
        for d in diffs:
            print("   ", d)
        bad += len(diffs)
    return 1 if bad else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("prepare").add_argument("dir", type=Path)
    r = sub.add_parser("run")
    r.add_argument("code", type=Path)
    r.add_argument("out", type=Path)
    r.add_argument("--config", type=Path, help="the extra sweeps (default OUT/../extra.json)")
    r.add_argument(
        "run_args",
        nargs=argparse.REMAINDER,
        help="more `run` options after the two paths, e.g. --extras all (a later version's way to "
        "compute what an earlier one computed by default)",
    )
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = p.parse_args()
    if args.cmd == "prepare":
        prepare(args.dir)
        return 0
    if args.cmd == "run":
        config = (args.config or args.out.parent / "extra.json").resolve()
        run(args.code.resolve(), args.out.resolve(), config, [a for a in args.run_args if a != "--"])
        return 0
    return compare(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
