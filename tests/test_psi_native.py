"""The native psi2 pair kernel (lvmcore.psi.native): against a dense reference, against the XLA
path of rbf_psi (values and vector-Jacobian products), its exp against numpy, a one-core process
(XLA's only thread runs the custom call), and the fallback when it cannot be built."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lvmcore.psi import closed_form as cf
from lvmcore.psi import native

pytestmark = pytest.mark.skipif(
    not native.available(), reason=f"native kernel unavailable: {native.unavailable_reason()}"
)


@pytest.fixture(scope="module", autouse=True)
def _float64():
    """This module's own jax arithmetic in float64 (lvmcore scopes its own; the process flag stays off)."""
    with jax.enable_x64(True):
        yield


def _dense_reference(mu, S, l2, Z):
    """acc (P,) = sum_n exp(U[n, m] + U[n, m'] + a_n . Zc[p]) from q(X) with every (N, P) exponential
    formed at once (native.py's expansion written out in jax, differentiated by autodiff)."""
    a = 1.0 / (l2 + 2.0 * S)
    r = -0.5 * jnp.log1p(2.0 * S / l2).sum(1) - (a * mu * mu).sum(1)
    U = (a * mu) @ Z.T - 0.25 * a @ (Z * Z).T + 0.5 * r[:, None]  # (N, M)
    iu, ju = np.triu_indices(Z.shape[0])
    return jnp.exp(U[:, iu] + U[:, ju] + a @ (-0.5 * Z[iu] * Z[ju]).T).sum(0)


@jax.jit
def _reference_vjp(mu, S, l2, Z, c):
    """The dense reference and its VJP with ``c``, compiled as one program (op by op, each of its
    primitives compiled alone, it cost most of the test's time)."""
    acc, vjp = jax.vjp(_dense_reference, mu, S, l2, Z)
    return acc, vjp(c)


def _rel(a, b):
    return np.abs(np.asarray(a) - np.asarray(b)).max() / max(np.abs(np.asarray(b)).max(), 1e-300)


@pytest.mark.parametrize("N,M,Q", [(70, 6, 3), (64, 5, 9), (3, 4, 1), (130, 3, 10)])
def test_kernel_equals_dense_reference(N, M, Q):
    """pairs_qx_fwd / pairs_qx_bwd (custom calls under jit) against the dense reference: acc and the
    VJP onto mu, S, l2, Z, with and without acc from the backward pass. Tiles with a tail (70, 130
    rows), exactly one tile (64), fewer rows than a vector (3); the compile-time Q variants (1, 3,
    10) and the generic loop (9)."""
    rng = np.random.default_rng(N + M + Q)
    mu, S = rng.normal(size=(N, Q)), rng.uniform(0.05, 0.6, (N, Q))
    l2, Z, c = rng.uniform(0.5, 2.0, Q), rng.normal(size=(M, Q)), rng.normal(size=M * (M + 1) // 2)
    acc, want = _reference_vjp(mu, S, l2, Z, c)
    assert _rel(jax.jit(native.pairs_qx_fwd)(mu, S, l2, Z), acc) < 1e-13
    for with_acc in (False, True):
        *got, acc_b = jax.jit(native.pairs_qx_bwd, static_argnames="with_acc")(mu, S, l2, Z, c, with_acc)
        for g, w in zip(got, want, strict=True):
            assert _rel(g, w) < 1e-13
        assert _rel(acc_b, acc) < 1e-13 if with_acc else not np.any(np.asarray(acc_b))


def test_exp_against_numpy():
    x = np.concatenate([np.linspace(-745.0, 709.0, 200_000), [-np.inf, np.inf, np.nan, -708.5, 709.5, 0.0]])
    x = np.concatenate([x, np.zeros((-len(x)) % 4)])
    y = np.empty_like(x)
    native.library().vexp_array(len(x), x.ctypes.data, y.ctypes.data)
    with np.errstate(over="ignore"):
        ref = np.exp(x)
    ok = (x >= -708.0) & (x <= 709.0)
    assert (np.abs(y[ok] - ref[ok]) / ref[ok]).max() < 5e-16
    assert np.all(y[x < -708.0] == 0.0)  # the true values are below 3.4e-308
    # overflow: +inf where the true value overflows; between 709 and log(max double), the
    # AVX-512 build gives the finite value, the portable one +inf
    assert np.all(np.isposinf(y[np.isposinf(ref)]))
    near = (x > 709.0) & np.isfinite(ref)
    assert np.all(np.isposinf(y[near]) | (np.abs(y[near] - ref[near]) < 5e-16 * ref[near]))
    assert np.isnan(y[np.isnan(x)]).all()


def _case(N=150, M=12, Q=4, D=3, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(
        jnp.asarray(a)
        for a in (
            rng.normal(size=(N, Q)),
            rng.uniform(0.05, 0.6, (N, Q)),
            rng.normal(size=(M, Q)),
            1.7,
            rng.uniform(0.6, 2.0, Q),
            rng.normal(size=(N, D)),
        )
    )


@pytest.mark.slow
def test_rbf_psi_native_equals_xla():
    """Values and the vector-Jacobian product for all six inputs, native against the XLA path, and
    the chunked backward task's primal=False form."""
    args = _case()
    M, D = args[2].shape[0], args[5].shape[1]
    rng = np.random.default_rng(1)
    cot = (jnp.asarray(0.4), jnp.asarray(rng.normal(size=(M, D))), jnp.asarray(rng.normal(size=(M, M))))
    out_x, vjp_x = jax.vjp(lambda *a: cf.rbf_psi(*a, impl="xla"), *args)
    g_x = vjp_x(cot)
    for primal in (True, False):
        out_n, vjp_n = jax.vjp(lambda *a, pr=primal: cf.rbf_psi(*a, impl="native", primal=pr), *args)
        if primal:
            for a, b in zip(out_n, out_x):
                assert _rel(a, b) < 1e-12
        else:
            assert not np.any(np.asarray(out_n[1])) and not np.any(np.asarray(out_n[2]))
        for k, (a, b) in enumerate(zip(vjp_n(cot), g_x)):
            assert np.shape(a) == np.shape(b), k
            assert _rel(a, b) < 1e-11, k


def test_rbf_psi_implementation_names(monkeypatch):
    """The native kernel by default where it builds; the XLA path when EMBED_SWEEP_NATIVE=0 turns
    it off; either by name."""
    with pytest.raises(ValueError, match="unknown psi implementation 'gpu'"):
        cf.rbf_psi(*_case(), impl="gpu")
    monkeypatch.delenv(native.ENV_SWITCH, raising=False)
    assert cf.resolve_impl(None) == "native" and cf.resolve_impl("xla") == "xla"
    monkeypatch.setenv(native.ENV_SWITCH, "1")
    assert cf.resolve_impl(None) == "native"
    monkeypatch.setenv(native.ENV_SWITCH, "0")
    assert cf.resolve_impl(None) == "xla"
    monkeypatch.setenv(native.ENV_SWITCH, "Off")
    assert cf.resolve_impl(None) == "xla"
    monkeypatch.setenv(native.ENV_SWITCH, "of")  # misspelt: refused, not read as "on"
    with pytest.raises(ValueError, match="EMBED_SWEEP_NATIVE='of' is not a switch; set it to 0 or 1"):
        cf.resolve_impl(None)


def _run_python(code, env_extra, timeout=240):
    env = dict(os.environ, **env_extra)
    cmd = [sys.executable, "-c", textwrap.dedent(code)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def test_one_core_process_runs_the_custom_call():
    """A process pinned to one core (as each sweep worker is) has one XLA thread; the kernel runs
    on it. A host callback deadlocked here; this would time out."""
    code = """
        import os
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
        import jax, numpy as np
        from lvmcore.psi import closed_form as cf, native
        assert native.available()
        rng = np.random.default_rng(0)
        mu, S = rng.normal(size=(300, 3)), rng.uniform(0.1, 0.5, (300, 3))
        Z, Y = rng.normal(size=(8, 3)), rng.normal(size=(300, 2))
        with jax.enable_x64(True):  # lvmcore traced inside the caller's own transformation
            f = jax.jit(jax.value_and_grad(lambda mu: cf.rbf_psi(mu, S, Z, 1.0, 1.0, Y)[2].sum()))
            v, g = f(mu)
        print("ok", float(v), float(np.abs(np.asarray(g)).sum()))
    """
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this platform")
    proc = _run_python(code, {native.ENV_SWITCH: "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("ok ")


def test_without_a_compiler_falls_back_to_xla(tmp_path):
    code = """
        import warnings
        warnings.simplefilter("always")
        import numpy as np
        from lvmcore.psi import closed_form as cf, native
        with warnings.catch_warnings(record=True) as w:
            ok = native.available()
        assert not ok and "no C/C++ compiler" in native.unavailable_reason(), native.unavailable_reason()
        assert any("using the XLA path" in str(x.message) for x in w)
        rng = np.random.default_rng(0)
        mu, S, Z = rng.normal(size=(20, 2)), rng.uniform(0.1, 0.5, (20, 2)), rng.normal(size=(5, 2))
        out = cf.rbf_psi(mu, S, Z, 1.0, 1.0, np.ones((20, 1)))
        print("ok", float(out[2].sum()))
    """
    env = {"CC": "/nonexistent/cc", "CXX": "/nonexistent/c++", "PATH": str(tmp_path), native.ENV_SWITCH: "1"}
    env[native.ENV_DIR] = str(tmp_path / "native")
    proc = _run_python(code, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("ok ")


def test_vmap_over_test_points_equals_loop():
    """transform() infers test points under jax.vmap; the custom calls then run one by one."""
    mu, S, Z, var, ls, Y = _case(N=6, M=5, Q=2, D=2)

    def f(m):
        return cf.rbf_psi(m[None], S[:1], Z, var, ls, Y[:1], impl="native")[2]

    batched = jax.vmap(f)(mu)
    for i in range(mu.shape[0]):
        assert _rel(batched[i], f(mu[i])) < 1e-14


@pytest.mark.slow
def test_gradient_under_vmap_equals_xla():
    """A differentiated bound's gradient, alone and under vmap (the custom calls run one by one),
    equals the XLA path's."""
    mu, S, Z, var, ls, Y = _case(N=40, M=5, Q=2, D=3)

    def loss(m, impl):
        return jnp.sum(cf.rbf_psi(m, S, Z, var, ls, Y, impl=impl)[2] ** 2)

    assert _rel(jax.grad(loss)(mu, "native"), jax.grad(loss)(mu, "xla")) < 1e-11
    batch = jnp.stack([mu, 1.1 * mu, 0.9 * mu])
    g_v = jax.vmap(jax.grad(loss), in_axes=(0, None))(batch, "native")
    for i in range(3):
        assert _rel(g_v[i], jax.grad(loss)(batch[i], "xla")) < 1e-11
