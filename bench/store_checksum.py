"""What the result store's crc32c checksums cost (tasks.store.CHECKSUMMED, issue 36 item 3): one
glle_em group (embedding, 3 generations, the per-point scalars) at N points x latent_dim 2 over 4
grid points, written with tasks.store.write_point and read back by tasks.store.verify_points (what
every open of a store does), once with zstd + crc32c and once with zstd alone, alternating every
round; per point the median and the best round, and their ratios. The machine is shared: read
the ratios (the best round's is the least disturbed by other load).

    python bench/store_checksum.py [N] [rounds]        # default 100000 points, 5 rounds
"""

import os

for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[v] = "1"

import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import zarr  # noqa: E402
from zarr.codecs import ZstdCodec  # noqa: E402

import tasks.store as st  # noqa: E402
from tasks.registry import MODELS  # noqa: E402


def main(n: int, rounds: int) -> None:
    spec = MODELS["glle_em"]
    grid = {"k": [6, 8, 10, 12], "latent_dim": [2], "seed": [0]}
    layout = st.Layout(n_points=n, q_max=2, n_generations=3, trace_len={spec.key: 100})
    rng = np.random.default_rng(0)
    res = st.PointResult(
        key=spec.key, index=(0, 0, 0), point={}, status="done", embedding=rng.normal(size=(n, 2)),
        elbo=1.0, elbo_trace=rng.normal(size=50), n_iter=50, converged=1, fit_seconds=1.0,
        extras={"generations": rng.normal(size=(3, n, 2))},
    )  # fmt: skip
    sides = {"zstd": (ZstdCodec(level=0),), "zstd+crc32c": st.CHECKSUMMED}
    times = {k: {"write": [], "verify": []} for k in sides}
    tmp = Path(tempfile.mkdtemp(prefix="store-checksum-"))
    try:
        for _ in range(rounds):
            for name, codecs in sides.items():
                st.CHECKSUMMED = codecs  # read by the template writer at each call
                path = tmp / f"{name}.zarr"
                shutil.rmtree(path, ignore_errors=True)
                zarr.open_group(str(path), mode="w", zarr_format=3)
                st._write_template(st.group_template(spec, grid, layout), path, spec.key)
                zarr.open_group(str(path), mode="a").attrs["groups"] = f'["{spec.key}"]'
                t = time.perf_counter()
                for i in range(4):
                    res.index = (i, 0, 0)
                    st.write_point(path, spec, res, layout)
                times[name]["write"].append((time.perf_counter() - t) / 4)
                t = time.perf_counter()
                assert st.verify_points(path) == []
                times[name]["verify"].append((time.perf_counter() - t) / 4)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for stat, f in (("median", np.median), ("best", np.min)):
        m = {k: {op: float(f(v)) for op, v in d.items()} for k, d in times.items()}
        for k in sides:
            print(f"N={n} {stat:6s} {k:12s}: write_point {m[k]['write'] * 1e3:7.1f} ms/point, "
                  f"verify_points {m[k]['verify'] * 1e3:7.1f} ms/point")  # fmt: skip
        ratios = ", ".join(f"{op} {m['zstd+crc32c'][op] / m['zstd'][op]:.3f}" for op in ("write", "verify"))
        print(f"N={n} {stat:6s} zstd+crc32c / zstd: {ratios}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000, int(sys.argv[2]) if len(sys.argv) > 2 else 5)
