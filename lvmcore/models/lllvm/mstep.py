"""M-step (paper 000 appendix C, eqs. 72-80): gamma, beta, alpha, each the exact maximiser of the
bound with q(x), q(C) and the others fixed.

* gamma: the gaussian likelihood's <log p(y | x, C)> is concave in gamma (log-det concave,
  -gamma^2 r / (o + 2 gamma w) concave); dense solver: root of its derivative by Brent's method;
  factorised solver: a partial M-step, safeguarded Newton steps in log gamma on the exact bound
  (generalised EM). The quadratic variant: D/2 log|eps_y I + 2 gamma L| - gamma/2 <S> (eqs. 72-73),
  root by log-secant steps.
* beta: closed form beta^{-1} = tr[(eps_c O + 2 L kron I)(Sigma_C + mu_C' mu_C / D)] / (N Q).
* alpha: Q/2 log|alpha I + 2L| - alpha/2 (tr Sigma_x + |mu_x|^2) (eq. 79), root by log-secant steps.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import brentq

from .likelihood import FactStats, LikStats, expected_S, gauss_loglik, lik_stats
from .operators import QC, QX, LLGraph, Theta, c_prior_quad, lap_logdet_trace

#: relative tolerance of the 1-D root finding for alpha and gamma
ROOT_RTOL = 1e-10
#: evaluations of the alpha and gamma M-step equations (secant steps in log space, each a
#: factorisation on the sparse path) before falling back to Brent's method
ROOT_MAX_EVALS = 30


def _log_secant(psi, x0: float, lo: float, hi: float):
    """Root of ``psi``, decreasing in u = log x with slope in [-1, 0), inside (lo, hi), from x0.

    The M-step equations for alpha and gamma take this form (see their docstrings): each
    evaluation is a factorisation on the sparse path, so the steps are secant steps in log x
    (the first with slope -1, exact where the trace is dominated by one power of x), safeguarded
    by bisection of the sign-change bracket. Returns the last point at which ``psi`` was evaluated
    once the next step would move x by less than ``ROOT_RTOL`` relative (so the bound reuses its
    memoised log-det), or None if ``psi`` is not finite or that does not happen in
    ``ROOT_MAX_EVALS`` evaluations.
    """
    ulo = np.log(lo) if lo > 0 else -np.inf
    uhi = np.log(hi) if np.isfinite(hi) else np.inf
    u = float(np.log(x0))
    prev = None
    for _ in range(ROOT_MAX_EVALS):
        f = psi(float(np.exp(u)))
        if not np.isfinite(f):
            return None
        if f > 0:
            ulo = max(ulo, u)
        else:
            uhi = min(uhi, u)
        slope = -1.0
        if prev is not None and u != prev[0]:
            slope = (f - prev[1]) / (u - prev[0])
            if not slope < 0:
                slope = -1.0
        step = -f / slope
        if abs(step) <= ROOT_RTOL:
            return float(np.exp(u))
        prev = (u, f)
        u_new = u + step
        if not ulo < u_new < uhi:  # outside the bracket: bisect it (or jump by e where open)
            if np.isfinite(ulo) and np.isfinite(uhi):
                u_new = 0.5 * (ulo + uhi)
            else:
                u_new = u + (1.0 if f > 0 else -1.0)
        u = u_new
    return None


def _x_stat(qx: QX) -> float:
    return float(np.sum(np.trace(qx.cov, axis1=1, axis2=2)) + np.sum(qx.mean**2))


def _root(grad, lo: float, hi: float, *, from_below: bool) -> float:
    """Root of a decreasing ``grad`` with grad(lo) >= 0 >= grad(hi) known analytically.

    The root lies close to the analytic end (``lo`` when ``from_below``, else ``hi``), so the bracket
    is grown geometrically from that end before Brent's method; this needs far fewer evaluations
    (each one a factorisation on the sparse path) than bracketing [lo, hi] directly.
    """
    if from_below:
        a, b = lo, min(lo * 1.05, hi)
        while b < hi and grad(b) > 0:
            a, b = b, min(2.0 * b, hi)
    else:
        a, b = max(hi / 1.05, lo), hi
        while a > lo and grad(a) < 0:
            a, b = max(a / 2.0, lo), a
    if grad(b) >= 0:  # numerically at the end of the interval
        return b
    return float(brentq(grad, a, b, rtol=ROOT_RTOL, xtol=1e-300))


def update_alpha(g: LLGraph, qx: QX, a0: float | None = None) -> float:
    """argmax_alpha Q/2 log|alpha I + 2L| - alpha/2 (tr Sigma_x + |mu_x|^2)  (eq. 79).

    ``a0``: a starting guess (EM passes the current alpha); it changes how fast, not where, the
    root is found."""
    n, Q = qx.mean.shape
    c = _x_stat(qx)

    def grad(a):
        return 0.5 * Q * lap_logdet_trace(g, a, 1.0)[1] - 0.5 * c

    # tr((aI+2L)^{-1}) lies between 1/a and n/a, so log(Q tr) - log(c) falls in log a with slope
    # in [-1, 0); solve it by safeguarded secant steps in log a, else bracket in [Q/c, Q n/c]
    lo, hi = Q / c, Q * n / c
    start = a0 if a0 is not None and lo < a0 < hi else lo
    a = _log_secant(lambda a: np.log(Q * lap_logdet_trace(g, a, 1.0)[1]) - np.log(c), start, lo, hi)
    if a is not None:
        return a
    return _root(grad, lo, hi, from_below=True)


def update_beta(g: LLGraph, qc: QC, th: Theta) -> float:
    """beta^{-1} = (1 / (N Q)) tr[(eps_c O + 2 L kron I)(Sigma_C + mu_C^T mu_C / D)]  (closed form)."""
    n, D, Q = qc.mean.shape
    tr_cov, tr_mean = c_prior_quad(g, qc, th.eps_c)
    return float(n * Q / (tr_cov + tr_mean / D))


def _update_gamma_gaussian(Y, g: LLGraph, th: Theta, st: LikStats) -> float:
    D = Y.shape[1]
    om, o = g.omega, g.offset(th.eps_y)

    def grad(gam):
        lam = o + 2.0 * gam * om
        return D * np.sum(om / lam) - st.trYLY + st.lin - np.sum(st.rk * gam * (o + gam * om) / lam**2)

    lo = hi = max(th.gamma, 1e-12)
    if grad(hi) > 0:  # grow the bracket upwards
        while grad(hi) > 0:
            lo, hi = hi, 2.0 * hi
            if hi > 1e300:
                raise ValueError(
                    "the gamma update has no finite maximiser (the expected log-likelihood grows)"
                )
    else:  # shrink downwards; grad -> D sum_k w_k / o_k > 0 as gamma -> 0
        while grad(lo) <= 0:
            lo, hi = lo / 2.0, lo
            if lo < 1e-300:
                return float(hi)
    return float(brentq(grad, lo, hi, rtol=ROOT_RTOL, xtol=1e-300))


#: the gamma step: central-difference step in log gamma, Newton steps per EM iteration at most, and
#: the step length in log gamma below which it stops
GAMMA_H = 0.02
GAMMA_STEPS = 3
GAMMA_STOP = 1e-2


def _update_gamma_factorised(Y, g: LLGraph, th: Theta, st: FactStats) -> float:
    """The factorised solver's gamma step, a partial M-step (generalised EM): safeguarded Newton
    steps in u = log gamma on the exact bound (derivatives by central differences of exact values,
    each one factorisation and selected inversion), until a step is shorter than ``GAMMA_STOP`` or
    after ``GAMMA_STEPS``.
    <log p(y | x, C)> is concave in gamma, hence unimodal in u; a step that does not raise the bound
    is halved, so the bound never decreases. Over EM iterations gamma reaches the stationary point."""

    def f(u):
        return gauss_loglik(Y, g, th, st, float(np.exp(u)))

    u = float(np.log(th.gamma))
    fu = f(u)
    for _ in range(GAMMA_STEPS):
        h = GAMMA_H
        fp, fm = f(u + h), f(u - h)
        d1, d2 = (fp - fm) / (2 * h), (fp - 2 * fu + fm) / h**2
        if d2 < 0:
            step = float(np.clip(-d1 / d2, -1.0, 1.0))
        else:  # not concave in u here: move to the better neighbour's side
            step = 1.0 if fp > fm else -1.0
        best = max((fu, u), (fp, u + h), (fm, u - h))
        for _ in range(4):  # else keep the best of u, u +- h
            fn = f(u + step)
            if fn >= best[0]:
                best = (fn, u + step)
                break
            step *= 0.5
        moved = abs(best[1] - u)
        u, fu = best[1], best[0]
        if moved < GAMMA_STOP:
            break
    return float(np.exp(u))


def update_gamma(
    Y, g: LLGraph, qx: QX, qc: QC, th: Theta, stats: LikStats | FactStats | None = None
) -> float:
    """argmax_gamma <log p(y | x, C)> on ``g``'s solver and likelihood (the dense gaussian: Brent's
    method on the exact derivative; factorised: safeguarded Newton steps on the exact bound; quadratic:
    log-secant steps). ``stats``: the gaussian likelihood statistics of (qx, qc) if already computed
    (they do not depend on gamma)."""
    if g.solver == "factorised":
        return _update_gamma_factorised(Y, g, th, stats if stats is not None else lik_stats(Y, g, qx, qc))
    if g.likelihood == "gaussian":
        return _update_gamma_gaussian(Y, g, th, stats if stats is not None else lik_stats(Y, g, qx, qc))
    n, D = Y.shape
    S = expected_S(Y, g, qx, qc)

    def grad(gam):
        tr = lap_logdet_trace(g, th.eps_y, gam)[1]
        return 0.5 * D / gam * (n - th.eps_y * tr) - 0.5 * S

    # n - eps_y tr = n - 1 - u(gamma), u = sum_{omega>0} eps_y / (eps_y + 2 gamma omega) >= 0, for a
    # connected graph: the root solves log(D (n - 1 - u)) - log(gamma S) = 0, falling in log gamma
    # with slope in (-1, 0); safeguarded secant steps in log gamma from the current gamma, else bracket
    hi = D * (n - 1) / S

    def psi(gam):
        f = D * (n - th.eps_y * lap_logdet_trace(g, th.eps_y, gam)[1])
        return np.log(f) - np.log(gam * S) if f > 0 else np.inf

    gam = _log_secant(psi, th.gamma if 0 < th.gamma < hi else hi, 0.0, hi)
    if gam is not None:
        return gam
    return _root(grad, 0.0, hi, from_below=False)
