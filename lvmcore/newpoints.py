"""New points of the Bayesian GP-LVM family (paper 004 section 4.5, appendices B-C), each its own
problem: q(x*) = N(mu*, diag S*) of one new row maximises that row's uncollapsed bound with the
fitted q(u) held fixed,

    F*(mu*, S*) = sum_v E_q(x*) q(u_v)[log p(y*_v | f*_v)] - KL(q(x*) || N(0, I)),

over the views v it is observed in. With q(u_v) in the whitened form of ``lvmcore.uncollapsed``
(u = L_m v, q(v) = N(m, S_v), m: M x D, E = I - S_v) and the row's statistics whitened,
a = L_m^-1 psi1 and C = L_m^-1 (Psi2 - psi1 psi1^T) L_m^-T (the covariance of the whitened
k(x, Z) under q(x*), from ``lvmcore.psi.row_moments``),

    E[log p(y | f)] = D/2 (log beta - log 2 pi)
                      - beta/2 (|y - m^T a|^2 + <C, m m^T - D E> + D (psi0 - a^T E a))

and the predictive moments at q(x*) (appendix C, noise included)

    mean_d = a . m_d,   var_d = psi0 - a^T E a - <E, C> + m_d^T C m_d + 1 / beta

(at the collapsed optimum L_m^-T E L_m^-1 = K_mm^-1 - B^-1, B = K_mm + beta Psi2: the textbook
form, ``lvmcore.collapsed.predict``, with Psi2 = C + a a^T in whitened units). Each term is a
residual or a variance, none the difference of two large ones: written as y^T y - 2 a . (m y) +
<A, m m^T> + ... with A = C + a a^T, the terms reach |y|^2 and cancel to the row's residual, and
on an atlas's fit the bound rounded at a few 1e-7 of its size (its gradient at ~1e-6), enough to
stop rows short of their optimum. Whitened, no K_mm^-1 is formed whatever K_mm's conditioning.

At the collapsed optimum q(u) is the one that maximises the uncollapsed bound, so a training
row's fitted q(x_n) is a stationary point of its own F*: its transform lands on it.

The optimiser (:func:`maximise`) is damped Newton per row, vectorised: each row has its own
Hessian (the RBF views' terms in closed form, the rest by autodiff: :func:`_hessian`),
eigenvalues made positive (a descent direction at saddles too), backtracking line search and
stopping rule (its gradient, checked with the Hessian: at a saddle the row steps along F*'s
positive curvature and goes on; at the bound's rounding floor, where no step decreases the
value, full steps are taken while they halve the gradient), and a finished row is frozen while
the others go on. Nothing couples rows, so a row's answer does not depend on the rows beside it
(to rounding: batched products may sum in another order).
Each row starts at the best, by F*, of its ``START_CANDIDATES`` nearest training rows' q(x_n),
nearest by the noise-weighted distance sum_v beta_v ||y_v - E[f_v(x_n)]||^2 to the training rows'
predictive means (the model's own reconstruction of its training rows: no training data kept).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import solve_triangular

from lvmcore import uncollapsed
from lvmcore.graph import knn_query
from lvmcore.kernels.euclidean import RBF, get_kernel
from lvmcore.linalg import cholesky_jax
from lvmcore.precision import x64
from lvmcore.psi import psi1, row_moments
from lvmcore.psi.closed_form import kl_diag_gaussian, rbf_row_curvature

__all__ = [
    "ViewTerms",
    "posterior_u",
    "view_terms",
    "reconstruction",
    "cell_bound",
    "cell_moments",
    "maximise",
    "infer_rows",
    "starts",
    "MAX_ITER",
    "GTOL",
    "START_CANDIDATES",
]

#: Newton iterations per row at most
MAX_ITER = 100
#: a row stops when its gradient's largest entry is at most GTOL x (1 + |F*|)
GTOL = 1e-10
#: training rows whose q(x_n) are tried as a row's start (the best by F* is taken)
START_CANDIDATES = 5
#: the start search ranks in the span of the training rows' reconstructions: the directions of their
#: Gram matrix with eigenvalues above this fraction of the largest (below it: rounding; a linear
#: kernel's reconstructions span Q dimensions), at most this many searched by a k-d tree
#: (scipy's cKDTree), more by brute force; twice the candidates are found there and ranked again
#: by the full distance (bench/README.md, "Mapping new cells")
START_SPAN_TOL, START_TREE_DIM = 1e-12, 8
#: largest step of one iteration in any coordinate (latent units, log-variance units)
MAX_STEP = 1.0
#: step halvings of the backtracking line search before a row counts as at its rounding floor
LS_HALVINGS = 40
#: at the rounding floor of the bound's value, a full step is taken where it shrinks the gradient's
#: norm by this factor and the value falls, or rises by at most POLISH_SLACK x (1 + |F*|) (its
#: rounding: the terms of F* are residuals and variances, module docstring; near the optimum of a
#: row of an atlas's fit its value rounds at ~1e-10 of its size)
POLISH, POLISH_SLACK = 0.5, 1e-9
#: a row whose Newton step promises a decrease of -F* below FLOOR_DECREASE x (1 + |F*|) is at the
#: rounding floor of the bound's value already: no halving can show a true decrease there, so it
#: goes straight to the floor's rule (a full step where it shrinks the gradient); the line search
#: likewise stops halving a row once its halved step would promise less. Rows that took the
#: value's rounding for decreases would halve their block's step up to LS_HALVINGS times an
#: iteration and stop short of their optimum
FLOOR_DECREASE = 1e-9
#: the Hessian's eigenvalues are floored at this fraction of the largest one's magnitude
EIG_FLOOR = 1e-10
#: rows per compiled call, the one shape of every call (their per-row Psi2 and Hessians are held
#: at once): a row's answer depends on the compiled shape it is computed in (XLA's code for another
#: batch size rounds a row differently, and a rounding difference can move where a row stops),
#: never on the other rows of its block, so one shape for every call makes each row's answer
#: independent of the rows mapped with it, and compiles each function once per process. Per row,
#: 256 is as fast as larger blocks (bench/README.md, "Mapping new cells")
BLOCK_ROWS = 256
#: Newton iterations between two gatherings of the unfinished rows (``maximise``)
SEGMENT = 4
#: a Hessian eigenvalue of -F* below -SADDLE x the largest magnitude marks a saddle (or a minimum)
SADDLE = 1e-8
#: Armijo's sufficient-decrease constant
ARMIJO = 1e-4
LOG_2PI = float(np.log(2.0 * np.pi))


class ViewTerms(NamedTuple):
    """One view's fixed quantities for new rows, whitened (module docstring)."""

    Z: jax.Array  # [M, Q] inducing inputs
    kp: dict  # the kernel's parameters
    log_beta: jax.Array  # [] noise precision, log
    Lm: jax.Array  # [M, M] chol(K_mm + jitter)
    m: jax.Array  # [M, D] q(v)'s mean
    E: jax.Array  # [M, M] I - S_v
    G: jax.Array  # [M, M] m m^T - D (I - S_v)


@x64
def posterior_u(Kmm, stats, log_beta, rel_jitter=0.0):
    """The whitened q(v) (u = L_m v) that maximises the uncollapsed bound for the training
    statistics (psi0, Psi1^T Y, Psi2, tr(Y^T Y)) (``lvmcore.uncollapsed.optimal_qu``, the collapsed
    optimum): (mean (M, D), covariance S_v (M, M)) as NumPy."""
    P, m = uncollapsed.optimal_qu(Kmm, stats, log_beta, 1.0, rel_jitter)
    return np.asarray(m), covariance_of_precision(P)


@x64
def covariance_of_precision(P) -> np.ndarray:
    """S = P^-1 from the Cholesky factor of P (symmetric by construction)."""
    R = jnp.linalg.cholesky(jnp.asarray(P))
    Rinv = solve_triangular(R, jnp.eye(R.shape[0]), lower=True)
    return np.asarray(Rinv.T @ Rinv)


@x64
def view_terms(Kmm, Z, kp, log_beta, qu_mean, qu_cov, rel_jitter=0.0) -> ViewTerms:
    """:class:`ViewTerms` of a view from its K_mm (with its jitter), inducing inputs, kernel
    parameters, log beta and whitened q(v) (``rel_jitter``: the fit's extra relative jitter)."""
    Lm = cholesky_jax(jnp.asarray(Kmm), rel_jitter)
    m = jnp.asarray(qu_mean)
    E = jnp.eye(Lm.shape[0]) - jnp.asarray(qu_cov)
    E = 0.5 * (E + E.T)
    G = m @ m.T - m.shape[1] * E
    conv = lambda a: np.asarray(a)  # noqa: E731
    return ViewTerms(
        conv(Z), jax.tree_util.tree_map(conv, kp), conv(log_beta), conv(Lm), conv(m), conv(E), conv(G)
    )


@x64
def reconstruction(kind, t: ViewTerms, mu, S, block: int = 65536) -> np.ndarray:
    """E[f(x_n)] = psi1_n L_m^-T m (N, D) at rows' q(x_n) (centred units), in row blocks."""
    kern = get_kernel(kind)
    out = []
    for a in range(0, len(mu), block):
        P1 = psi1(kern, mu[a : a + block], S[a : a + block], t.Z, t.kp)  # (n, M)
        out.append(np.asarray(solve_triangular(t.Lm, P1.T, lower=True).T @ t.m))
    return np.vstack(out) if out else np.zeros((0, t.m.shape[1]))


def _one_row(kern, mu, S, t: ViewTerms):
    """(psi0, a = L_m^-1 psi1 [M], C = L_m^-1 (Psi2 - psi1 psi1^T) L_m^-T [M, M]) of one row under
    N(mu, diag S) (``lvmcore.psi.row_moments``; vmapped over rows). Whitened, the terms stay of
    the kernel's size whatever K_mm's conditioning (no K_mm^-1 is formed)."""
    p0, p1, cov = row_moments(kern, mu, S, t.Z, t.kp)
    a1 = solve_triangular(t.Lm, p1, lower=True)
    C = solve_triangular(t.Lm, solve_triangular(t.Lm, cov, lower=True).T, lower=True)
    return p0, a1, 0.5 * (C + C.T)


def _row_bound(kinds, x, terms, ys, views=None):
    """F* of one row at x = [mu, log S] (module docstring); ys[v]: the row's centred view v (D_v,).
    ``views``: the views whose terms are included (default all; the KL term always is)."""
    Q = x.shape[0] // 2
    mu, S = x[:Q], jnp.exp(x[Q:])
    F = -kl_diag_gaussian(mu[None], S[None])
    for v, kind in enumerate(kinds):
        if views is not None and v not in views:
            continue
        t = terms[v]
        p0, a1, C = _one_row(get_kernel(kind), mu, S, t)
        D = t.m.shape[1]
        beta = jnp.exp(t.log_beta)
        r = ys[v] - a1 @ t.m
        sq = r @ r + jnp.sum(C * t.G) + D * (p0 - a1 @ (t.E @ a1))
        F = F + 0.5 * D * (t.log_beta - LOG_2PI) - 0.5 * beta * sq
    return F


@functools.lru_cache(maxsize=64)
def _row_functions(kinds: tuple):
    """Jitted, vmapped over rows: -F* and (-F*, its gradient) at x (n, 2Q)."""

    def neg(x, terms, ys):
        return -_row_bound(kinds, x, terms, ys)

    axes = (0, None, 0)
    return jax.jit(jax.vmap(neg, in_axes=axes)), jax.jit(jax.vmap(jax.value_and_grad(neg), in_axes=axes))


@x64
def cell_bound(kinds, terms, Ys, mu, S) -> np.ndarray:
    """F* (n,) of n rows at q(x*) = N(mu, diag S) (``Ys``: the rows' centred views, (n, D_v) each)."""
    val, _ = _row_functions(tuple(kinds))
    x = np.concatenate([np.asarray(mu, float), np.log(np.asarray(S, float))], axis=1)
    out = []
    for a in range(0, len(x), BLOCK_ROWS):
        r = slice(a, a + BLOCK_ROWS)
        f = val(jnp.asarray(_pad(x[r])), tuple(terms), tuple(jnp.asarray(_pad(np.asarray(Y)[r])) for Y in Ys))
        out.append(-np.asarray(f)[: len(x[r])])
    return np.concatenate(out) if out else np.zeros(0)


@functools.lru_cache(maxsize=16)
def _moments(kind: str):
    kern = get_kernel(kind)

    def one(mu, S, t):
        p0, a1, C = _one_row(kern, mu, S, t)
        mean = a1 @ t.m
        # the expected conditional variance plus q(u)'s, then the mean's spread under q(x*)
        var = (p0 - a1 @ (t.E @ a1) - jnp.sum(t.E * C)) + jnp.einsum("md,mk,kd->d", t.m, C, t.m)
        return mean, var + jnp.exp(-t.log_beta)

    return jax.jit(jax.vmap(one, in_axes=(0, 0, None)))


@x64
def cell_moments(kind, t: ViewTerms, mu, S) -> tuple[np.ndarray, np.ndarray]:
    """Predictive mean and variance (n, D) of one view at q(x*) = N(mu, diag S), noise included
    (centred units)."""
    mu, S = np.asarray(mu, float), np.asarray(S, float)
    means, variances = [], []
    for a in range(0, len(mu), BLOCK_ROWS):
        r = slice(a, a + BLOCK_ROWS)
        mean, var = _moments(kind)(jnp.asarray(_pad(mu[r])), jnp.asarray(_pad(S[r])), t)
        means.append(np.asarray(mean)[: len(mu[r])])
        variances.append(np.asarray(var)[: len(mu[r])])
    if not means:
        return np.zeros((0, t.m.shape[1])), np.zeros((0, t.m.shape[1]))
    return np.vstack(means), np.vstack(variances)


def _hessian(kinds: tuple):
    """Each row's Hessian of -F* at x (n, 2Q) -> (n, 2Q, 2Q), traced in the Newton iteration. The
    RBF views' terms come in closed form (``closed_form.rbf_row_curvature``: reverse over
    reverse through the RBF psi statistics' custom rule differentiates that whole rule once per
    input direction); the KL and any other view by autodiff, reverse over reverse. For the closed
    form the bound is taken in its textbook terms (-2 a . (m y) + <A, G>, A = C + a a^T) and the
    whitening moved onto the fixed weights: a . (m y) = psi1 . L_m^-T m y and <A, G> =
    <Psi2, L_m^-T G L_m^-1> (the curvature only shapes the step; the values and gradients that
    decide its acceptance and the stopping rule keep the module docstring's form)."""
    rbf = tuple(v for v, kind in enumerate(kinds) if get_kernel(kind) is RBF)
    others = tuple(v for v in range(len(kinds)) if v not in rbf)

    def neg(x, terms, ys):
        return -_row_bound(kinds, x, terms, ys, others)

    auto = jax.vmap(jax.jacrev(jax.grad(neg)), in_axes=(0, None, 0))

    def hess(x, terms, ys):
        H = auto(x, terms, ys)
        Q = x.shape[1] // 2
        for v in rbf:
            t = terms[v]
            beta = jnp.exp(t.log_beta)
            bt = solve_triangular(t.Lm, t.m @ ys[v].T, lower=True, trans="T").T  # (n, M): L_m^-T m y
            Gt = solve_triangular(
                t.Lm, solve_triangular(t.Lm, t.G, lower=True, trans="T").T, lower=True, trans="T"
            )
            H = H + rbf_row_curvature(
                x[:, :Q], jnp.exp(x[:, Q:]), t.Z, jnp.exp(t.kp["log_var"]), jnp.exp(t.kp["log_ls"]),
                -beta * bt, (0.25 * beta) * (Gt + Gt.T),
            )[2]  # fmt: skip
        return H

    return hess


@functools.lru_cache(maxsize=64)
def _newton(kinds: tuple):
    """The per-row damped Newton iteration (module docstring), jitted: x0 (n, 2Q) -> (x, -F*,
    iterations, converged, still going) per row."""
    val, vg = _row_functions(kinds)
    hess = _hessian(kinds)

    def done(f, g, gtol):
        return jnp.max(jnp.abs(g), axis=1) <= gtol * (1.0 + jnp.abs(f))

    def run(x0, terms, ys, max_iter, gtol):
        n = x0.shape[0]
        args = (terms, ys)
        f0, g0 = vg(x0, *args)
        state = {
            "it": jnp.int32(0), "x": x0, "f": f0, "g": g0,
            # a row at a zero gradient still has its curvature checked
            "active": jnp.isfinite(f0),
            "n_iter": jnp.zeros(n, jnp.int32),
        }  # fmt: skip

        def cond(s):
            return (s["it"] < max_iter) & jnp.any(s["active"])

        def body(s):
            x, f, g, act = s["x"], s["f"], s["g"], s["active"]
            # Newton's direction on the Hessian with its eigenvalues' signs flipped and floored
            # (a descent direction at saddles and maxima too)
            H = hess(x, *args)
            lam, U = jnp.linalg.eigh(0.5 * (H + jnp.swapaxes(H, 1, 2)))
            top = jnp.max(jnp.abs(lam), axis=1, keepdims=True)
            # a row whose gradient rule is met stops, unless it sits at a saddle of F*: then it
            # steps along the direction of F*'s largest positive curvature
            saddle = lam[:, 0] < -SADDLE * top[:, 0]
            met = done(f, g, gtol)
            escaping = met & saddle
            act = act & ~(met & ~saddle)
            escape = U[:, :, 0] * jnp.where(jnp.sum(g * U[:, :, 0], axis=1) > 0, -1.0, 1.0)[:, None]
            lam = jnp.maximum(jnp.abs(lam), EIG_FLOOR * top + 1e-300)
            d = -jnp.einsum("nij,nj->ni", U, jnp.einsum("nji,nj->ni", U, g) / lam)
            d = jnp.where(escaping[:, None], MAX_STEP * escape, d)
            d = d * jnp.minimum(1.0, MAX_STEP / jnp.maximum(jnp.max(jnp.abs(d), axis=1), 1e-300))[:, None]
            gd = jnp.minimum(jnp.sum(g * d, axis=1), 0.0)
            # Newton's promised decrease under the value's rounding (not a saddle's escape, whose
            # decrease is of second order): the line search could not see it
            floor_dec = FLOOR_DECREASE * (1.0 + jnp.abs(f))
            flat = ~escaping & (-gd <= floor_dec)

            def lcond(ls):
                return (ls[0] < LS_HALVINGS) & jnp.any(ls[2])

            def lbody(ls):
                k, a, search, lost = ls
                ft = val(x + a[:, None] * d, *args)
                ok = jnp.isfinite(ft) & (ft <= f + ARMIJO * a * gd) & (ft < f)  # a strict decrease
                again = search & ~ok
                # the halved step would promise a decrease under the value's rounding: no further
                # halving can show one, so the row stops searching and goes to the floor's rule
                gone = again & (-0.5 * a * gd <= floor_dec)
                return k + 1, jnp.where(again & ~gone, 0.5 * a, a), again & ~gone, lost | gone

            # the full step's trial with its gradient: where it is taken (accepted, or the floor's
            # rule) that is the next iterate's, and only rows that halved need another pass
            ft, gt = vg(x + d, *args)
            ok = jnp.isfinite(ft) & (ft <= f + ARMIJO * gd) & (ft < f)
            again = act & ~flat & ~ok
            gone = again & (-0.5 * gd <= floor_dec)
            start = (jnp.int32(1), jnp.where(again & ~gone, 0.5, 1.0), again & ~gone, gone)
            _, a, todo, lost = jax.lax.while_loop(lcond, lbody, start)
            todo = todo | lost | (act & flat)
            # at the bound's rounding floor no step decreases its value: there the full step is
            # taken where it shrinks the gradient (the values' floor is far above the gradient's)
            floor = act & todo
            x1 = jnp.where(floor[:, None], x + d, x + a[:, None] * d)
            halved = act & ~floor & (a < 1.0)
            fh, gh = jax.lax.cond(jnp.any(halved), lambda: vg(x1, *args), lambda: (ft, gt))
            # a row's values come from one pass whatever the rows beside it do
            f1, g1 = jnp.where(halved, fh, ft), jnp.where(halved[:, None], gh, gt)
            gn, gn1 = jnp.linalg.norm(g, axis=1), jnp.linalg.norm(g1, axis=1)
            near = f1 <= f + POLISH_SLACK * (1.0 + jnp.abs(f))
            polish = floor & jnp.isfinite(f1) & (gn1 < POLISH * gn) & near
            step = (act & ~todo) | polish
            x1 = jnp.where(step[:, None], x1, x)
            f1, g1 = jnp.where(step, f1, f), jnp.where(step[:, None], g1, g)
            return {
                "it": s["it"] + 1, "x": x1, "f": f1, "g": g1,
                "active": step,
                "n_iter": s["n_iter"] + act.astype(jnp.int32),
            }  # fmt: skip

        s = jax.lax.while_loop(cond, body, state)
        return s["x"], s["f"], s["n_iter"], done(s["f"], s["g"], gtol), s["active"]

    return jax.jit(run)


def _pad(a: np.ndarray) -> np.ndarray:
    """``a`` (at most BLOCK_ROWS rows) padded with copies of its first row to BLOCK_ROWS: the one
    shape of every compiled call (see BLOCK_ROWS)."""
    n = len(a)
    return np.concatenate([a, np.repeat(a[:1], BLOCK_ROWS - n, axis=0)]) if 0 < n < BLOCK_ROWS else a


@x64
def maximise(kinds, terms, Ys, mu0, S0, max_iter: int = MAX_ITER, gtol: float = GTOL):
    """Each row's q(x*) maximising its F* from (mu0, S0) (module docstring), ``BLOCK_ROWS`` rows
    at a time: (mu (n, Q), S (n, Q), F* (n,), iterations (n,), converged (n,): the gradient rule
    met, else the row stopped at its rounding floor or at ``max_iter``); ``Ys``: the rows' centred
    views (n, D_v) each. Every SEGMENT iterations the rows still going, over all blocks, are
    gathered into new blocks: a block costs its slowest row's iterations times its size, and most
    rows finish in a few. A row's answer is the same either way: the iteration restarts from its
    x, and a stopped row stays stopped."""
    n, Q = mu0.shape
    run = _newton(tuple(kinds))
    x = np.concatenate([mu0, np.log(S0)], axis=1)
    f, it, conv = np.full(n, np.nan), np.zeros(n, np.int64), np.zeros(n, bool)
    Ys = [np.asarray(Y, dtype=np.float64) for Y in Ys]
    rows, left = np.arange(n), int(max_iter)
    while len(rows) and left > 0:
        steps = min(SEGMENT, left)
        going = []
        for a in range(0, len(rows), BLOCK_ROWS):
            r = rows[a : a + BLOCK_ROWS]
            out = run(
                jnp.asarray(_pad(x[r])), tuple(terms), tuple(jnp.asarray(_pad(Y[r])) for Y in Ys),
                steps, float(gtol),
            )  # fmt: skip
            xr, fr, ir, cr, live = (np.asarray(o)[: len(r)] for o in out)
            x[r], f[r], it[r], conv[r] = xr, fr, it[r] + ir, cr
            going.append(r[live])
        rows = np.concatenate(going)
        left -= steps
    return x[:, :Q], np.exp(x[:, Q:]), -f, it, conv


def start_candidates(ref: np.ndarray, qry: np.ndarray, k: int) -> np.ndarray:
    """The k rows of ``ref`` nearest to each row of ``qry`` (n, k), nearest first. The distance
    |q - r|^2 splits into the part in the span of ref's rows and the part outside it, which is
    the same for every r: so the search runs in that span (START_SPAN_TOL), by a k-d tree where it
    is small (START_TREE_DIM), for 2k candidates, which the full distance then ranks (ties: the
    lower index). Per row: a row's candidates do not depend on the rows beside it."""
    k = min(int(k), len(ref))
    lam, V = np.linalg.eigh(ref.T @ ref)
    V = V[:, lam > START_SPAN_TOL * max(lam[-1], 0.0)] if len(lam) else V
    if V.shape[1] == 0:  # every reconstruction is zero: all are equally near
        return np.tile(np.arange(k), (len(qry), 1))
    c = min(2 * k, len(ref))
    Pr, Pq = ref @ V, np.einsum("nd,dr->nr", qry, V)
    if V.shape[1] <= START_TREE_DIM:
        from scipy.spatial import cKDTree

        cand = np.asarray(cKDTree(Pr).query(Pq, c)[1]).reshape(len(qry), c)
    else:
        cand = knn_query(Pr, Pq, c)[0]
    full = np.empty(cand.shape)
    for j in range(c):  # one candidate column at a time: (n, D) in memory, not (n, 2k, D)
        diff = ref[cand[:, j]] - qry
        full[:, j] = np.einsum("nd,nd->n", diff, diff)
    order = np.lexsort((cand, full), axis=1)[:, :k]
    return np.take_along_axis(cand, order, axis=1)


def starts(kinds, terms, Ys, recon, mu_train, S_train, k: int = START_CANDIDATES):
    """Each row's start (mu0, S0): of its k training rows nearest by sum_v beta_v ||y_v - E[f_v]||^2
    (``recon``: the training rows' predictive means per view; :func:`start_candidates`), the
    q(x_n) with the highest F* (ties: the nearer)."""
    n = Ys[0].shape[0]
    w = [np.sqrt(np.exp(float(t.log_beta))) for t in terms]
    ref = np.hstack([wv * R for wv, R in zip(w, recon, strict=True)])
    qry = np.hstack([wv * Y for wv, Y in zip(w, Ys, strict=True)])
    idx = start_candidates(ref, qry, k)  # (n, k), nearest first
    F = np.column_stack([cell_bound(kinds, terms, Ys, mu_train[j], S_train[j]) for j in idx.T])
    F = np.where(np.isfinite(F), F, -np.inf)
    best = idx[np.arange(n), np.argmax(F, axis=1)]
    return mu_train[best], S_train[best]


def infer_rows(kinds, terms, Ys, recon, mu_train, S_train, max_iter: int = MAX_ITER, gtol: float = GTOL):
    """q(x*) of new rows observed in the views of ``terms`` (their centred data ``Ys``), each row on
    its own (module docstring): (mu, S, F*, iterations, converged) as :func:`maximise`."""
    mu0, S0 = starts(kinds, terms, Ys, recon, mu_train, S_train)
    return maximise(kinds, terms, Ys, mu0, S0, max_iter, gtol)
