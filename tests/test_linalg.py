"""Cholesky with jitter, solves and log-determinants."""

import numpy as np
import pytest

from lvmcore import linalg


def _spd(n, seed=0):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(n, n))
    return A @ A.T + n * np.eye(n)


def test_plain_cholesky_adds_nothing():
    A = _spd(6)
    L, added = linalg.jitter_cholesky(A, return_jitter=True)
    assert added == 0.0
    np.testing.assert_allclose(L, np.linalg.cholesky(A))
    np.testing.assert_array_equal(np.triu(L, 1), 0.0)


def test_jitter_escalates_on_semidefinite():
    rng = np.random.default_rng(1)
    B = rng.normal(size=(8, 3))
    A = B @ B.T  # rank 3: singular, plain Cholesky fails (or is numerically indefinite)
    A[0, 0] -= 1e-9 * np.trace(A)  # make it surely indefinite at the 1e-9 relative level
    L, added = linalg.jitter_cholesky(A, return_jitter=True)
    scale = np.mean(np.diag(A))
    base = linalg.DEFAULT_JITTER * scale
    schedule = [base * linalg.JITTER_GROWTH**i for i in range(linalg.MAX_JITTER_TRIES)]
    assert added in schedule and added > schedule[0]  # 1e-10 relative is not enough, a later step is
    np.testing.assert_allclose(L @ L.T, A + added * np.eye(8), atol=1e-10 * scale)


def test_numerical_error_names_the_matrix():
    A = -np.eye(4)
    with pytest.raises(linalg.NumericalError, match=r"Kuu is not positive definite at EM iteration 3") as e:
        linalg.jitter_cholesky(A, name="Kuu", context="EM iteration 3")
    assert e.value.name == "Kuu" and e.value.context == "EM iteration 3"
    np.testing.assert_array_equal(e.value.matrix, A)
    assert isinstance(e.value, FloatingPointError)
    bad = _spd(3)
    bad[1, 2] = np.nan
    with pytest.raises(linalg.NumericalError, match="Sigma has non-finite entries"):
        linalg.jitter_cholesky(bad, name="Sigma")
    with pytest.raises(ValueError, match="must be square"):
        linalg.jitter_cholesky(np.ones((2, 3)), name="K")


def test_batched_cholesky():
    A = np.stack([_spd(4, s) for s in range(3)])
    L = linalg.jitter_cholesky(A)
    np.testing.assert_allclose(L @ np.swapaxes(L, -1, -2), A, atol=1e-10)
    np.testing.assert_allclose(linalg.logdet_from_chol(L), np.linalg.slogdet(A)[1])


def test_solves_and_logdet():
    A = _spd(7, 3)
    B = np.random.default_rng(4).normal(size=(7, 2))
    L = linalg.jitter_cholesky(A)
    np.testing.assert_allclose(linalg.chol_solve(L, B), np.linalg.solve(A, B), rtol=1e-10)
    np.testing.assert_allclose(linalg.logdet_from_chol(L), np.linalg.slogdet(A)[1])


def test_chol_inverse_is_the_inverse_and_log_determinant():
    """The one explicit inverse (LAPACK potrf + potri, the point hGP-LVM's step): K^-1 and log|K|
    against numpy's; only the lower triangle from chol_inverse_lower; a refusal naming the matrix."""
    from lvmcore.linalg import chol_inverse, chol_inverse_lower

    rng = np.random.default_rng(0)
    A = rng.standard_normal((30, 30))
    K = A @ A.T + 30 * np.eye(30)
    Ki, logdet = chol_inverse(K)
    np.testing.assert_allclose(Ki, np.linalg.inv(K), rtol=1e-10, atol=1e-14)
    np.testing.assert_array_equal(Ki, Ki.T)
    assert logdet == pytest.approx(np.linalg.slogdet(K)[1], rel=1e-12)
    lower, _ = chol_inverse_lower(K)
    np.testing.assert_allclose(np.tril(lower), np.tril(np.linalg.inv(K)), rtol=1e-10, atol=1e-14)
    with pytest.raises(np.linalg.LinAlgError, match="the kernel matrix is not positive definite"):
        chol_inverse(-K, "the kernel matrix")
