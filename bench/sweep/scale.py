"""The issue-23 sweep at scale: wall time per stage and peak RSS per process.

Two measurements of the same sweep (``--models glle_em,ppca,bgplvm_rbf``, grid k = 10,
latent_dim = 2, seed = 0) on one data set:

* ``sweep``: the real command, ``embed-sweep run --dataset ... --no-report``, as a child process;
  every process of its tree is sampled (psutil, every 0.2 s) for its resident memory: the flow
  process (the CLI), the Prefect server, each Dask worker. Prints its wall time and each
  process's peak RSS.
* ``stages``: the sweep's stages as the same plain calls the tasks make, in order, in one child
  process (ingest_dataset, build_graph, plan_sweep + prepare_store, then per model fit_point,
  evaluate_point, write_point), each timed, and its peak RSS read from VmHWM after resetting it
  (``/proc/self/clear_refs``) at the start of the stage; "above start" is that peak less the RSS
  the stage began with, and "/ data" that rise in copies of the data set.

Anchors measured in the same run, on the same data: ``np.load`` of the data as a .npy file (the
least a process can do to hold the data) and scipy's ``cKDTree(Y).query(Y, k=11, workers=2)``.
Each stage is printed with its ratio to the cKDTree anchor (time) and to the data's size (memory).

Data: ``roll3`` is ``{"name": "swiss_roll", "n": N}``; ``roll50`` is the same roll embedded in 50
dimensions (a fixed random orthonormal 3 -> 50 map plus N(0, 0.05^2) noise), written as a user's
.npy file, so its ingest is a file ingest.

    nice -n 5 flock /work/wt/_notes/timing.lock .venv/bin/python -m bench.sweep.scale --n 100000 --data roll3
    .venv/bin/python -m bench.sweep.scale --n 1000000 --data roll3 --what stages --models ppca,glle_em
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import ROOT, module_command, process_role, quiet_prefect, reset_peak, status_mb

quiet_prefect()

GRID = {"k": [10], "latent_dim": [2], "seed": [0]}
MODELS = "glle_em,ppca,bgplvm_rbf"


def make_data(kind: str, n: int, tmp: Path) -> tuple[object, Path]:
    """(the sweep's --dataset value, a .npy file holding the same Y for the anchors)."""
    import numpy as np

    from lvmcore.data import load

    npy = tmp / f"{kind}-{n}.npy"
    if npy.exists():  # a --dir reused by a later run: the same file (written whole below)
        return ({"name": "swiss_roll", "n": n} if kind == "roll3" else {"path": str(npy)}), npy
    if kind == "roll3":
        ds = {"name": "swiss_roll", "n": n}
        np.save(npy, load("swiss_roll", n=n)["Y"].values)
        return ds, npy
    if kind == "roll50":
        from lvmcore.data.synthetic import swiss_roll

        Y3, _ = swiss_roll(n, 0)
        rng = np.random.default_rng(50)
        Q, _ = np.linalg.qr(rng.standard_normal((50, 3)))  # orthonormal columns
        out = np.lib.format.open_memmap(npy, mode="w+", dtype=np.float64, shape=(n, 50))
        step = 65536
        for a in range(0, n, step):
            b = min(a + step, n)
            out[a:b] = Y3[a:b] @ Q.T + 0.05 * rng.standard_normal((b - a, 50))
        out.flush()
        del out
        return {"path": str(npy)}, npy
    raise ValueError(f"--data must be roll3 or roll50, got {kind!r}")


def anchors(npy: Path) -> dict:
    import numpy as np
    from scipy.spatial import cKDTree

    t0 = time.perf_counter()
    Y = np.load(npy)
    t_load = time.perf_counter() - t0
    t_tree = float("nan")
    if Y.shape[1] <= 12:  # a k-d tree in 50 dimensions is a slow brute force: no anchor there
        t0 = time.perf_counter()
        cKDTree(Y).query(Y, k=11, workers=2)
        t_tree = time.perf_counter() - t0
    return {"np_load_s": t_load, "ckdtree_s": t_tree, "data_mb": Y.nbytes / 2**20, "shape": list(Y.shape)}


# ---------------------------------------------------------------- the sweep, process by process


def _role(p) -> str:
    try:
        return process_role(p.cmdline())
    except Exception:
        return "?"


def _anon_bytes(pid: int) -> int:
    """RssAnon: the resident memory that is the process's own (not file pages it has mapped)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon"):
                return int(line.split()[1]) * 1024
    return 0


def run_sweep(dataset, models: str, tmp: Path, timeout: float, options: dict) -> dict:
    """The real CLI as a child process, its process tree's RSS sampled until it ends."""
    import psutil

    cmd = [
        str(ROOT / ".venv/bin/embed-sweep"),
        "run",
        "--dataset",
        json.dumps(dataset),
        "--models",
        models,
        "--grid",
        json.dumps(GRID),
        "--out",
        str(tmp / "out"),
        "--store",
        "scale.zarr",
        "--no-report",
        *(["--options", json.dumps(options)] if options else []),
    ]
    before = _points(tmp)
    log = open(tmp / "sweep.log", "w")  # noqa: SIM115
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    root = psutil.Process(proc.pid)
    peak: dict[int, list] = {}  # pid -> [role, peak rss, first seen, last seen]
    while proc.poll() is None:
        now = time.perf_counter() - t0
        if now > timeout:
            for c in root.children(recursive=True):
                c.kill()
            proc.kill()
            break
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        for p in procs:
            try:
                rss = p.memory_info().rss
                anon = _anon_bytes(p.pid)
            except (psutil.Error, OSError):
                continue
            if p.pid not in peak:
                peak[p.pid] = ["flow process (CLI)" if p.pid == proc.pid else _role(p), 0, now, now, 0]
            peak[p.pid][1] = max(peak[p.pid][1], rss)
            peak[p.pid][4] = max(peak[p.pid][4], anon)
            peak[p.pid][3] = now
        time.sleep(0.2)
    wall = time.perf_counter() - t0
    proc.wait()
    log.close()
    tail = (tmp / "sweep.log").read_text()[-3000:]
    points = _points(tmp)
    return {
        "points": points,
        "before": before,
        "wall_s": wall,
        "rc": proc.returncode,
        "timed_out": wall > timeout,
        "processes": sorted(
            ([r, rss / 2**20, a, b, anon / 2**20] for r, rss, a, b, anon in peak.values()),
            key=lambda x: (x[0], -x[1]),
        ),
        "log_tail": tail,
    }


def _points(tmp: Path) -> dict:
    """Each model's grid points by status in the sweep's store (how far a run got; with --dir, what
    an earlier run had done already)."""
    import numpy as np

    try:
        import zarr

        root = zarr.open_group(str(tmp / "out" / "scale.zarr"), mode="r")
        points = {}
        for key in root.group_keys():
            st = np.asarray(root[key]["status"][...]).ravel()
            points[key] = {
                "done": int((st == 1).sum()),
                "failed": int((st == 2).sum()),
                "pending": int((st == 0).sum()),
            }
        return points
    except Exception as e:  # no store yet: it stopped before the store was set up
        return {"store": f"not readable ({type(e).__name__})"}


# ---------------------------------------------------------------- the stages, one by one


def stages_child(dataset, models: str, tmp: Path, options: dict) -> None:
    """Runs in its own process: the sweep's stages as the tasks call them; one JSON line each."""
    from tasks.evaluate import evaluate_point
    from tasks.fit import fit_point
    from tasks.ingest import ingest_dataset
    from tasks.inputs import load_data, load_graph
    from tasks.knn import build_graph
    from tasks.registry import MODELS as REG
    from tasks.registry import options_for
    from tasks.store import prepare_store, write_point
    from tasks.sweep_plan import input_paths, plan_sweep

    def stage(name, fn, *args):
        reset_peak()
        start = status_mb("VmRSS")
        t0 = time.perf_counter()
        out = fn(*args)
        row = {"stage": name, "s": time.perf_counter() - t0, "peak_mb": status_mb(), "start_mb": start}
        print(json.dumps(row), flush=True)
        return out

    store = str(tmp / f"stages-{os.getpid()}.zarr")  # fresh inputs: ingest and kNN timed, not reused
    data_path, graph_path = input_paths(store)
    Path(data_path).parent.mkdir(parents=True, exist_ok=True)
    plan = stage(
        "plan (flow process)",
        lambda: plan_sweep(dataset, models.split(","), GRID, store, options or None, 3, "auto"),
    )
    stage("ingest", lambda: ingest_dataset(dataset, data_path, plan.identity["data_fingerprint"]))
    stage("kNN (k = 10)", lambda: build_graph(data_path, 10, graph_path, "auto"))
    load_data.cache_clear() if hasattr(load_data, "cache_clear") else None
    stage(
        "prepare store",
        lambda: prepare_store(store, plan.identity, plan.specs, plan.grid, plan.store_layout(), {}),
    )
    stage("read data + graph (worker)", lambda: (load_data(data_path), load_graph(graph_path)))
    point = {"k": 10, "latent_dim": 2, "seed": 0}
    for key in models.split(","):
        spec = REG[key]
        pt = {d: point[d] for d in spec.dims}
        idx = (0,) * len(spec.dims)
        n_gen = plan.store_layout().n_generations if "generations" in spec.extras else 0
        opts = options_for(spec, options)
        res = stage(f"fit {key}", fit_point, key, opts, data_path, graph_path, idx, pt, n_gen)
        if res.status != "done":
            print(json.dumps({"stage": f"fit {key}", "error": res.error}), flush=True)
        res = stage(f"evaluate {key}", evaluate_point, res, data_path)
        stage(f"write {key}", write_point, store, spec, res, plan.store_layout())


def run_stages(dataset, models: str, tmp: Path, timeout: float, options: dict) -> dict:
    cmd = module_command(
        __spec__.name, "--stages-child", json.dumps(dataset), "--models", models, "--tmp", str(tmp),
        "--options", json.dumps(options),
    )  # fmt: skip
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        out, err, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err, rc = f"timed out after {timeout:.0f} s", -9
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {"wall_s": time.perf_counter() - t0, "rc": rc, "rows": rows, "stderr_tail": err[-2000:]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--data", default="roll3", help="roll3 (swiss_roll) or roll50 (a 50-D .npy file)")
    ap.add_argument("--models", default=MODELS)
    ap.add_argument("--what", default="sweep,stages", help="sweep, stages or both (comma-separated)")
    ap.add_argument("--timeout", type=float, default=570.0, help="seconds per measurement")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--options", default="{}", help='model options, JSON: {"bgplvm": {"max_iter": 30}}')
    ap.add_argument(
        "--dir",
        help="work in this folder and keep it (default: a new temporary one). A later run with the "
        "same --dir and more --models grows the same sweep store: its ingest and kNN graph are "
        "reused and only the added models fit, so each model's peak RSS per process is its own",
    )
    ap.add_argument("--scratch", help="make the temporary folder under this one (default: the system's)")
    ap.add_argument("--stages-child")
    ap.add_argument("--tmp")
    a = ap.parse_args()
    if a.stages_child:
        stages_child(json.loads(a.stages_child), a.models, Path(a.tmp), json.loads(a.options))
        return
    if a.dir:
        tmp = Path(a.dir).absolute()
        tmp.mkdir(parents=True, exist_ok=True)
    else:
        tmp = Path(tempfile.mkdtemp(prefix="bench-scale-", dir=a.scratch))
    dataset, npy = make_data(a.data, a.n, tmp)
    anc = anchors(npy)
    mb = anc["data_mb"]
    print(f"data {a.data}: {anc['shape'][0]:,} x {anc['shape'][1]} float64 = {mb:.1f} MiB; models {a.models}")
    print(f"grid {json.dumps(GRID)}; options {a.options}")
    print(f"anchors: np.load {anc['np_load_s']:.3f} s; cKDTree build + query k=11 {anc['ckdtree_s']:.2f} s")
    print(f"load average at start: {open('/proc/loadavg').read().strip()}")
    result = {"n": a.n, "data": a.data, "models": a.models, "anchors": anc}
    whats = a.what.split(",")
    if "stages" in whats:
        st = run_stages(dataset, a.models, tmp, a.timeout, json.loads(a.options))
        result["stages"] = st
        print(f"\nstages (one process; rc {st['rc']}, {st['wall_s']:.1f} s):")
        print(
            f"{'stage':32s} {'wall s':>9s} {'/ cKDTree':>10s} {'peak RSS MiB':>13s} "
            f"{'above start':>12s} {'/ data':>7s}"
        )
        for r in st["rows"]:
            if "error" in r:
                print(f"  error: {r['error']}")
                continue
            print(
                f"{r['stage']:32s} {r['s']:9.2f} {r['s'] / anc['ckdtree_s']:9.2f}x "
                f"{r['peak_mb']:13.0f} {r['peak_mb'] - r['start_mb']:12.0f} "
                f"{(r['peak_mb'] - r['start_mb']) / mb:6.1f}x"
            )
        if st["rc"] != 0:
            print("stderr:", st["stderr_tail"])
    if "sweep" in whats:
        sw = run_sweep(dataset, a.models, tmp, a.timeout, json.loads(a.options))
        result["sweep"] = sw
        state = "TIMED OUT" if sw["timed_out"] else f"rc {sw['rc']}"
        print(
            f"\nsweep (embed-sweep run, 2 local workers): {sw['wall_s']:.1f} s ({state}); "
            f"{sw['wall_s'] / anc['ckdtree_s']:.0f}x the cKDTree anchor"
        )
        print(f"grid points by status before this run: {json.dumps(sw['before'])}")
        print(f"grid points by status: {json.dumps(sw['points'])}")
        print(f"{'process':34s} {'peak RSS MiB':>13s} {'/ data':>7s} {'peak RssAnon':>13s} {'alive s':>12s}")
        for role, rss, t_a, t_b, anon in sw["processes"]:
            if rss < 20:
                continue
            print(f"{role:34s} {rss:13.0f} {rss / mb:6.1f}x {anon:13.0f} {t_a:5.0f}-{t_b:5.0f}")
        if sw["rc"] != 0:
            print(sw["log_tail"])
    print(f"load average at end: {open('/proc/loadavg').read().strip()}")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
