"""Native (C) kernel for the pair sums of the RBF psi2 statistic: the default path of
``rbf_psi`` wherever it builds (``EMBED_SWEEP_NATIVE=0`` turns it off; ``rbf_psi(impl=...)``
picks one by name), built on first use. The XLA path remains the fallback and the reference it
is tested against; the kernel is the faster of the two at every size measured (bench/README.md,
"native kernel vs XLA").

Why: the bound of the Bayesian GP-LVM spends most of its time on the N x P pair exponentials of
Psi2 (P = M (M + 1) / 2): one exp per (row, pair) in the forward pass, and in the backward pass
the same exponentials again plus three contractions. XLA computes them as GEMMs of depth 2Q
around materialised (P, rows) blocks. Writing zbar = (z_m + z_m') / 2 and a_nq = 1 / (l2_q + 2 S_nq),
the exponent of row n and pair p = (m, m') splits into per-inducing-point terms and one
cross term of depth Q:

    x[p, n] = U[n, m] + U[n, m'] + sum_q a_nq Zc[p, q],   Zc[p, q] = -z_mq z_m'q / 2,
    U[n, m] = sum_q a_nq (mu_nq z_mq - z_mq^2 / 4) + r_n / 2,
    r_n     = -1/2 sum_q log(1 + 2 S_nq / l2_q) - sum_q a_nq mu_nq^2

(x is the log of Psi2_n[m, m'] / (variance^2 exp(-sum_q (z_mq - z_m'q)^2 / (4 l2_q))), as in
``closed_form``). ``lvmcore/psi/_pairs.c`` computes acc[p] = sum_n exp(x[p, n]) from q(X)
(:func:`pairs_qx_fwd`: U and a made per row tile from (mu, S, l2, Z), no (N, M) array and no XLA
operation in between) and, for a cotangent c of acc (:func:`pairs_qx_bwd`), the gradients with
respect to (mu, S, l2, Z) through those with respect to U, a and Zc: contractions of depth Q
instead of 2Q, over row tiles whose exponentials stay in L1; the backward pass recomputes them per
tile (faster than keeping them from the forward pass: a store of them, tried and removed, measured
slower at every size, bench/README.md). Its exp is a vectorised polynomial (about 1 ulp; checked
against numpy at load).
jax calls the kernel as an XLA custom call (``jax.ffi``): on XLA's thread, on XLA's buffers, no
Python in between (a ``jax.pure_callback`` deadlocked on a one-core worker: its arguments are
device_put back to the CPU device from inside XLA's only thread).

Build: on the first use in a process the C kernel and its C++ FFI handlers (against the headers
jaxlib ships) are compiled with the system compilers (``CC`` / ``CXX``, else cc / c++) into
``$EMBED_SWEEP_NATIVE_DIR`` (default ``$XDG_CACHE_HOME/embed-sweep/native``, ``~/.cache/...``),
keyed by a hash of the sources, the compilers' versions, the flags (AVX2 + FMA, and AVX-512, where
the CPU has them) and jax's version; the library is built in a temporary folder and renamed into
place, so concurrent workers never load a half-written file. Without compilers, or if the build or the self
check fails, :func:`available` is False, one warning says why, and ``closed_form.rbf_psi`` takes
its pure-XLA path (same values to ~1e-14).
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import jax
import jax.ffi
import jax.numpy as jnp
import numpy as np

from lvmcore import user_cache_dir

SOURCE = Path(__file__).with_name("_pairs.c")
FFI_SOURCE = Path(__file__).with_name("_pairs_ffi.cc")
FFI_TARGETS = {
    "qx_fwd": ("embed_sweep_pairs_qx_fwd", "EmbedSweepPairsQxFwd"),
    "qx_bwd": ("embed_sweep_pairs_qx_bwd", "EmbedSweepPairsQxBwd"),
}
ENV_SWITCH = "EMBED_SWEEP_NATIVE"
ENV_DIR = "EMBED_SWEEP_NATIVE_DIR"

_lock = threading.Lock()
_state: dict = {}  # "lib": ctypes library or None, "reason": why not


def cache_dir() -> Path:
    return Path(os.environ.get(ENV_DIR) or user_cache_dir("native"))


def _cpu_flags() -> list[str]:
    """-mavx2 -mfma on an x86-64 CPU that has both (read from /proc/cpuinfo), plus -mavx512f where
    it has that too (the kernel's vectors are then 8 doubles wide), else nothing (the vector code
    then compiles to the baseline SSE2 / NEON instructions)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return []
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            if not {"avx2", "fma"} <= flags:
                return []
            return ["-mavx2", "-mfma"] + (["-mavx512f"] if "avx512f" in flags else [])
    return []


def _compilers() -> tuple[str, str]:
    """(C compiler, C++ compiler): ``CC`` / ``CXX``, else cc / c++ (gcc / g++)."""
    cc = shutil.which(os.environ.get("CC") or "cc") or shutil.which("gcc")
    cxx = shutil.which(os.environ.get("CXX") or "c++") or shutil.which("g++")
    if cc is None or cxx is None:
        raise RuntimeError("no C/C++ compiler found (set CC and CXX, or install gcc and g++)")
    return cc, cxx


def _version(exe: str) -> str:
    try:
        return subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise RuntimeError(f"{exe} --version failed: {e}") from e


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")


def _build() -> Path:
    """Compile (or find in the cache) the shared library: the C kernel and its XLA FFI handlers
    (C++, against the headers jaxlib ships). Raises RuntimeError with the reason."""
    cc, cxx = _compilers()
    cflags = ["-O3", "-std=gnu11", "-fPIC", "-Wno-psabi", *_cpu_flags()]
    cxxflags = ["-O2", "-std=c++17", "-fPIC", "-I", jax.ffi.include_dir()]
    key = hashlib.sha256(
        b"\0".join(
            [SOURCE.read_bytes(), FFI_SOURCE.read_bytes(), _version(cc).encode(), _version(cxx).encode()]
            + [" ".join(f).encode() for f in (cflags, cxxflags)]
            + [platform.machine().encode(), jax.__version__.encode()]
        )
    ).hexdigest()[:20]
    out_dir = cache_dir()
    target = out_dir / f"pairs-{key}.so"
    if target.exists():
        return target
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError:
        out_dir = Path(tempfile.gettempdir()) / "embed-sweep-native"
        out_dir.mkdir(parents=True, exist_ok=True)
        target = out_dir / target.name
        if target.exists():
            return target
    # one build per machine: processes starting together (a cluster's workers) wait for the first
    with open(out_dir / f".pairs-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():
            return target
        with tempfile.TemporaryDirectory(dir=out_dir, prefix=".build-") as tmp:
            obj, lib = os.path.join(tmp, "pairs.o"), os.path.join(tmp, "pairs.so")
            _run([cc, *cflags, "-c", str(SOURCE), "-o", obj])
            _run([cxx, *cxxflags, "-shared", str(FFI_SOURCE), obj, "-o", lib])
            os.replace(lib, target)  # atomic: a reader that takes no lock sees no file or a whole one
    return target


def _load(path: Path):
    lib = ctypes.CDLL(str(path))
    lib.vexp_array.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    lib.vexp_array.restype = None
    # self check: the vectorised exp against numpy over the range the kernel uses
    x = np.ascontiguousarray(np.concatenate([np.linspace(-750.0, 20.0, 4092), [0.0, -1e-300, 1.0, -1.0]]))
    y = np.empty_like(x)
    lib.vexp_array(len(x), x.ctypes.data, y.ctypes.data)
    ref = np.exp(x)
    err = np.abs(y - ref) / np.maximum(ref, 1e-300)
    if not np.all(err[x > -700.0] < 1e-14) or np.any(y[x < -708.0] != 0.0):
        raise RuntimeError(f"self check failed: exp relative error {err[x > -700].max():.3g}")
    for name, symbol in FFI_TARGETS.values():
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
    return lib


def library():
    """The loaded kernel library, or None (see :func:`unavailable_reason`)."""
    if "lib" not in _state:
        with _lock:
            if "lib" not in _state:
                try:
                    _state["lib"] = _load(_build())
                    _state["reason"] = None
                except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                    _state["lib"], _state["reason"] = None, str(e)
                    warnings.warn(
                        f"embed-sweep: the native psi2 kernel is unavailable ({e}); using the XLA path",
                        RuntimeWarning,
                        stacklevel=2,
                    )
    return _state["lib"]


def enabled() -> bool:
    """Whether the default path (``rbf_psi(impl=None)``) uses the kernel: yes unless
    ``EMBED_SWEEP_NATIVE`` is 0 / false / no / off; any other value than those and 1 / true / yes /
    on is refused by name (a misspelt "off" must not leave the kernel on)."""
    value = os.environ.get(ENV_SWITCH, "1").strip().lower()
    if value not in ("0", "false", "no", "off", "1", "true", "yes", "on"):
        raise ValueError(f"{ENV_SWITCH}={os.environ[ENV_SWITCH]!r} is not a switch; set it to 0 or 1")
    return value in ("1", "true", "yes", "on")


def available() -> bool:
    """True if the kernel is built (or can be built now) and passed its self check."""
    return library() is not None


def unavailable_reason() -> str | None:
    library()
    return _state.get("reason")


# ---------------------------------------------------------------------------------------------
# the kernel's jax entries (XLA custom calls)
# ---------------------------------------------------------------------------------------------


def _f64(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.float64)


def _ffi(kind: str, result, *args, **attributes):
    """The kernel's XLA custom call ``FFI_TARGETS[kind]`` on the jax arrays ``args``, with result
    shape(s) ``result`` (:func:`_f64`) and the handler's ``attributes``."""
    return jax.ffi.ffi_call(FFI_TARGETS[kind][0], result, vmap_method="sequential")(*args, **attributes)


def pairs_qx_fwd(mu, S, l2, Z):
    """jax: acc (P,) from q(X) (mu, S (N, Q), l2 (Q,), Z (M, Q)) by the kernel."""
    return _ffi("qx_fwd", _f64(Z.shape[0] * (Z.shape[0] + 1) // 2), mu, S, l2, Z)


def pairs_qx_bwd(mu, S, l2, Z, c, with_acc: bool = False):
    """jax: (gmu, gS, gl2, gZ, acc), the gradients of sum_p c_p acc_p with respect to q(X) and Z
    (the exponentials recomputed), and acc itself if ``with_acc`` (else zeros, not computed)."""
    shapes = tuple(_f64(*x.shape) for x in (mu, S, l2, Z, c))
    return _ffi("qx_bwd", shapes, mu, S, l2, Z, c, with_acc=bool(with_acc))
