"""Brute-force references for the LL-LVM tests: expected log joints by explicit loops over the double
sums of paper 000 eqs. 13, 19, 23 and the explicit bilinear map e~(x, C) (eq. 30), on graphs small
enough (N = 6) to enumerate every basis direction. Shared by tests/test_lllvm*.py."""

from __future__ import annotations

import functools

import numpy as np

from lvmcore.models import lllvm as ll

N6, D3, Q2 = 6, 3, 2
LOG2PI = np.log(2 * np.pi)


# --------------------------------------------------------------------------- brute force
def tiny():
    """6 points in 3-D on a ring with two chords (connected, not complete)."""
    rng = np.random.default_rng(3)
    Y = rng.normal(size=(N6, D3))
    Wd = np.zeros((N6, N6))
    for i in range(N6):
        Wd[i, (i + 1) % N6] = Wd[(i + 1) % N6, i] = 1
    Wd[0, 3] = Wd[3, 0] = Wd[1, 4] = Wd[4, 1] = 1
    return Y, Wd


def expected_log_joint(Y, Wd, th, mx, Sx, mC, SC):
    """E[log p~(y|x,C) + log p(x) + log p(C)] by loops over the double sums of eqs. 13, 19, 23.

    q(x): mean mx (N, Q), covariance blocks Sx(i, j) -> (Q, Q); q(C): mean mC (N, D, Q), every row
    of C with covariance blocks SC(i, j) (a point mass where the blocks are zero).
    """
    n, D = Y.shape
    Q = mx.shape[1]
    L = np.diag(Wd.sum(1)) - Wd
    val = -0.5 * th.eps_y * np.sum(Y**2) - 0.5 * n * D * LOG2PI
    val += 0.5 * D * np.linalg.slogdet(th.eps_y * np.eye(n) + 2 * th.gamma * L)[1]
    for i in range(n):
        ECC = D * SC(i, i) + mC[i].T @ mC[i]
        for j in range(n):
            if not Wd[i, j]:
                continue
            a = Y[j] - Y[i]
            dm = mx[j] - mx[i]
            Sdx = Sx(j, j) + Sx(i, i) - Sx(i, j) - Sx(j, i)
            e = a @ a - 2 * a @ mC[i] @ dm + np.trace(ECC @ (Sdx + np.outer(dm, dm)))
            val -= 0.5 * th.gamma * e
    # prior on x: -1/2 sum_i (alpha |x_i|^2 + sum_j eta_ij |x_i - x_j|^2) - log Z_x
    val += 0.5 * Q * np.linalg.slogdet(th.alpha * np.eye(n) + 2 * L)[1] - 0.5 * n * Q * LOG2PI
    for i in range(n):
        val -= 0.5 * th.alpha * (np.trace(Sx(i, i)) + mx[i] @ mx[i])
        for j in range(n):
            if Wd[i, j]:
                dm = mx[i] - mx[j]
                val -= 0.5 * (np.trace(Sx(i, i) + Sx(j, j) - Sx(i, j) - Sx(j, i)) + dm @ dm)
    # prior on C, per row: beta (eps_c |C_i|^2 + sum_j eta_ij |C_i - C_j|^2)
    val += 0.5 * D * (n * Q * np.log(th.beta) + Q * np.linalg.slogdet(th.eps_c * np.eye(n) + 2 * L)[1])
    val -= 0.5 * n * Q * D * LOG2PI
    for i in range(n):
        val -= 0.5 * th.beta * th.eps_c * (D * np.trace(SC(i, i)) + np.sum(mC[i] ** 2))
        for j in range(n):
            if Wd[i, j]:
                dC = mC[i] - mC[j]
                tr = D * np.trace(SC(i, i) + SC(j, j) - SC(i, j) - SC(j, i))
                val -= 0.5 * th.beta * (tr + np.sum(dC**2))
    return val


def identify_quadratic(f, dim):
    """f(v) = -1/2 v'Pv + h'v + c exactly: recover (P, h) from evaluations."""
    c = f(np.zeros(dim))
    E = np.eye(dim)
    fp = np.array([f(E[i]) for i in range(dim)])
    fm = np.array([f(-E[i]) for i in range(dim)])
    h = 0.5 * (fp - fm)
    P = np.diag(-(fp + fm - 2 * c))
    for i in range(dim):
        for j in range(i + 1, dim):
            fij = f(E[i] + E[j])
            P[i, j] = P[j, i] = -(fij - c - h[i] - h[j]) - 0.5 * (P[i, i] + P[j, j])
    return P, h


def blocks(S, Q):
    return lambda i, j: S[i * Q : (i + 1) * Q, j * Q : (j + 1) * Q]


def zero(Q):
    return lambda i, j: np.zeros((Q, Q))


def em_steps(Y, Wd, g, qx, th, n_steps=3):
    """A few EM iterations (q(C), q(x), then gamma, beta, alpha), keeping each intermediate q."""
    for _ in range(n_steps):
        qc = ll.update_qc(Y, g, qx, th)
        qx_prev, qx = qx, ll.update_qx(Y, g, qc, th)
        th_prev = ll.Theta(**vars(th))
        th.gamma = ll.update_gamma(Y, g, qx, qc, th)
        th.beta = ll.update_beta(g, qc, th)
        th.alpha = ll.update_alpha(g, qx)
    return dict(Y=Y, Wd=Wd, g=g, qx=qx, qx_prev=qx_prev, qc=qc, th=th, th_prev=th_prev)


def full_cov_from_blocks(g, q, n, Q):
    """Callable (i, j) -> block from a q's diagonal and edge blocks (only those are ever needed)."""
    edge = {(int(i), int(j)): e for e, (i, j) in enumerate(zip(g.ei, g.ej))}

    def get(i, j):
        if i == j:
            return q.cov[i]
        if (i, j) in edge:
            return q.cov_edge[edge[(i, j)]]
        return q.cov_edge[edge[(j, i)]].T

    return get


def e_tilde(Wd, x, C):
    """e~ (N, D) with e~_i = sum_j eta_ij (C_i + C_j)(x_i - x_j), by loops."""
    n, D = C.shape[0], C.shape[1]
    e = np.zeros((n, D))
    for i in range(n):
        for j in range(n):
            if Wd[i, j]:
                e[i] += (C[i] + C[j]) @ (x[i] - x[j])
    return e


@functools.lru_cache(maxsize=8)
def _basis_maps(Wbytes, n, D, Q):
    """A_k (N D, N Q): x -> e~(x, C_k) for every basis direction C_k of C (by loops, cached)."""
    Wd = np.frombuffer(Wbytes).reshape(n, n)
    nC = D * n * Q
    A = []
    for k in range(nC):
        Ck = np.eye(nC)[k].reshape(D, n, Q).transpose(1, 0, 2)
        A.append(np.column_stack([e_tilde(Wd, v.reshape(n, Q), Ck).ravel() for v in np.eye(n * Q)]))
    return np.array(A)


def gauss_expected_log_lik(Y, Wd, th, mx, Sx_full, mC, SC_full, form="identity"):
    """<log N(y | Sigma_y e, Sigma_y)> under q(x) q(C) from the explicit bilinear map e~(x, C): the
    quartic expectation is summed over a basis of C's entries (each row of C independent with SC)."""
    n, D = Y.shape
    Q = mx.shape[1]
    L = np.diag(Wd.sum(1)) - Wd
    P = eps_matrix(n, th.eps_y, form) + th.gamma * 2 * L
    Pd = np.kron(P, np.eye(D))
    Ltd = np.linalg.inv(Pd)
    y = Y.ravel()
    A = _basis_maps(Wd.tobytes(), n, D, Q)
    mc = np.transpose(mC, (1, 0, 2)).ravel()
    EC = np.kron(np.eye(D), SC_full) + np.outer(mc, mc)
    Sxx = Sx_full + np.outer(mx.ravel(), mx.ravel())
    # quad = sum_km EC[k, m] tr(A_k' Lt A_m Sxx), all pairs at once
    T = np.einsum("kaq,qr,ab,mbr->km", A, Sxx, Ltd, A, optimize=True)
    quad = float(np.sum(EC * T))
    e_mean = th.gamma * e_tilde(Wd, mx, mC).ravel()
    return (
        -0.5 * y @ Pd @ y
        + y @ e_mean
        - 0.5 * th.gamma**2 * quad
        - 0.5 * n * D * LOG2PI
        + 0.5 * D * np.linalg.slogdet(P)[1]
    )


def eps_matrix(n, eps, form):
    return eps * (np.eye(n) if form == "identity" else np.ones((n, n)))


def gauss_expected_log_joint(Y, Wd, th, mx, Sx_full, mC, SC_full, form="identity"):
    """<log N(y | Sigma_y e, Sigma_y) + log p(x) + log p(C)> with dense matrices (O = I or 1 1^T)."""
    n, D = Y.shape
    Q = mx.shape[1]
    L = np.diag(Wd.sum(1)) - Wd
    Px = np.kron(th.alpha * np.eye(n) + 2 * L, np.eye(Q))
    m = mx.ravel()
    val = (
        0.5 * np.linalg.slogdet(Px)[1] - 0.5 * n * Q * LOG2PI - 0.5 * np.sum(Px * (Sx_full + np.outer(m, m)))
    )
    Ac = np.kron(eps_matrix(n, th.eps_c, form) + 2 * L, np.eye(Q))
    val += 0.5 * D * (n * Q * np.log(th.beta) + np.linalg.slogdet(Ac)[1]) - 0.5 * n * Q * D * LOG2PI
    for d in range(D):
        c = mC[:, d, :].ravel()
        val -= 0.5 * th.beta * np.sum(Ac * (SC_full + np.outer(c, c)))
    return val + gauss_expected_log_lik(Y, Wd, th, mx, Sx_full, mC, SC_full, form)


def check_mstep_stationary(s: dict, name: str) -> None:
    """The M-step's value of hyperparameter ``name`` (alpha, beta or gamma) in state ``s`` zeroes
    the bound's derivative in log space (central differences), while 0.3 away it clearly does not,
    and the bound is lower on both sides."""
    Y, g, qx, qc, th = s["Y"], s["g"], s["qx"], s["qc"], s["th"]

    def F(log_v):
        t = ll.Theta(**vars(th))
        setattr(t, name, float(np.exp(log_v)))
        return ll.elbo(Y, g, qx, qc, t)

    v0, h = np.log(getattr(th, name)), 1e-4

    def dF(v):
        return (F(v + h) - F(v - h)) / (2 * h)

    curvature = abs(F(v0 + h) - 2 * F(v0) + F(v0 - h)) / h**2
    assert abs(dF(v0)) < 1e-6 * max(curvature, 1.0)
    assert abs(dF(v0 + 0.3)) > 1e-2 * curvature  # away from the update it is clearly not zero
    assert F(v0) > max(F(v0 + 0.05), F(v0 - 0.05))


# --------------------------------------------------------------------------- factorised family
def ring8():
    """8 points in 3-D on a ring with the chord (1, 5): degrees 2 and 3, BFS depth 4, and pairs at
    graph distance 3 (so the distance-2 selections of the factorised solver are not everything)."""
    rng = np.random.default_rng(11)
    n = 8
    Y = rng.normal(size=(n, D3))
    Wd = np.zeros((n, n))
    for i in range(n):
        Wd[i, (i + 1) % n] = Wd[(i + 1) % n, i] = 1
    Wd[1, 5] = Wd[5, 1] = 1
    return Y - Y.mean(0), Wd


def block_diag_cov(cov):
    """The (N Q, N Q) block-diagonal covariance of a per-point factorised q from its (N, Q, Q) blocks."""
    n, Q, _ = cov.shape
    out = np.zeros((n * Q, n * Q))
    for i in range(n):
        out[i * Q : (i + 1) * Q, i * Q : (i + 1) * Q] = cov[i]
    return out


def factorised_entropy(qx, qc, D):
    """Entropy of q(x) q(C) for per-point blocks (each of the D rows of C_i has covariance V_i)."""
    Q = qx.mean.shape[1]

    def ent(cov):
        return float(np.sum(0.5 * Q * (1 + LOG2PI) + 0.5 * np.linalg.slogdet(cov)[1]))

    return ent(qx.cov) + D * ent(qc.cov)


def random_spd_blocks(rng, n, Q, scale=0.3):
    A = rng.normal(size=(n, Q, Q)) * scale
    return A @ np.swapaxes(A, 1, 2) + 0.05 * np.eye(Q)


def check_out_of_sample(m, Y, Ynew, k, gain=1.0):
    """LL-LVM's out-of-sample maps on a fitted roll (paper 000 section 4.2): ``transform`` gives
    (n, 2) means and positive-definite (n, 2, 2) covariances, each new point near the embedding of
    its nearest training point; ``inverse_transform``'s tangent term C_i (x* - x_i) reconstructs the
    new data better than ``gain`` times the plain mean of the k nearest training points in latent
    space. Returns (Xnew, Vnew)."""
    n = len(Ynew)
    Xnew, Vnew = m.transform(Ynew, return_cov=True)
    assert Xnew.shape == (n, 2) and Vnew.shape == (n, 2, 2)
    assert np.all(np.linalg.eigvalsh(Vnew) > 0)
    nn = ((Ynew[:, None, :] - Y[None]) ** 2).sum(-1).argmin(1)
    spread = np.ptp(m.embedding_, axis=0).max()
    assert np.median(np.linalg.norm(Xnew - m.embedding_[nn], axis=1)) < 0.05 * spread
    err = np.linalg.norm(m.inverse_transform(Xnew) - Ynew, axis=1)
    dl = ((Xnew[:, None, :] - m.embedding_[None]) ** 2).sum(-1)
    err_plain = np.linalg.norm(Y[np.argsort(dl, 1)[:, :k]].mean(1) - Ynew, axis=1)
    assert np.median(err) < gain * np.median(err_plain), (np.median(err), np.median(err_plain))
    return Xnew, Vnew
