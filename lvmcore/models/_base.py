"""The one estimator contract every lvmcore model follows (scikit-learn's, see ``_base`` docs).

- The constructor is keyword-only and stores its arguments unchanged; nothing else happens there.
- ``_parameter_constraints`` declares each parameter's rule as data (scikit-learn's
  ``sklearn.utils._param_validation`` vocabulary: ``Interval``, ``StrOptions``, types, ``None``);
  ``fit`` checks them first through ``self._validate_params()``, so a bad value is refused with
  the parameter named ("The 'tol' parameter of GLLE must be a float in the range [0.0, inf).
  Got -1 instead.") before any work.
- ``check_size(n_points)`` raises ValueError (naming the value and the fix) for settings that
  cannot work with that many points (``n_inducing`` or ``batch_size`` above N, a training that
  needs more rows); ``fit`` calls it, and a sweep's plan calls it with the data set's N at every
  grid point, so such a point is refused before any server or cluster starts.
- ``fit(Y, graph=None)`` returns ``self``; a model that cannot use a graph refuses one
  (``_refuse_graph``) instead of ignoring it. MRD takes a list of views in place of ``Y``.
- Learned state ends in ``_``: ``embedding_`` (N, Q) posterior mean or point estimate,
  ``embedding_var_`` (N, Q) marginal posterior variances or None where the model has none
  (full covariances, where a model has them, under ``embedding_cov_`` (N, Q, Q); LL-LVM's are of
  each point relative to the centroid, its prior's translation mode removed:
  ``lllvm.estimator.centroid_relative_cov``), ``elbo_`` (the
  model's own bound, or GLLE's log-likelihood), ``elbo_trace_`` (one entry per iteration,
  ``len == n_iter_``), ``n_iter_``, ``converged_`` (True where the fit ended by its own stopping
  rule, or has no iterations to stop (a closed form); False where it ran out of its iteration
  budget or its optimiser gave up, so that a store can say which of its numbers are optima).
- Before ``fit``, every method that needs learned state raises scikit-learn's ``NotFittedError``.
- ``transform`` never changes the fitted state.

``get_params`` / ``set_params`` / ``sklearn.base.clone`` come from ``BaseEstimator``, which reads
the parameter names off the constructor signature: every constructor argument must be stored
under its own name.
"""

from __future__ import annotations

from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

__all__ = ["LatentModel", "stalled"]


def stalled(trace, tol: float) -> bool:
    """The EM-type stopping rule: the last iteration changed the objective by at most ``tol``
    relative to it (GLLE's sigma updates, LL-LVM's variational EM)."""
    return len(trace) > 1 and abs(trace[-1] - trace[-2]) <= tol * abs(trace[-1])


class LatentModel(BaseEstimator):
    """Base of every lvmcore estimator: parameter rules as data, the fitted-state contract."""

    _parameter_constraints: dict = {}

    def _check_fitted(self) -> None:
        """Raise ``NotFittedError`` unless ``fit`` has run (``embedding_`` is set)."""
        check_is_fitted(self, "embedding_")

    def check_size(self, n_points: int) -> None:
        """Refuse settings that cannot work with ``n_points`` points (module docstring); the
        parameter rules are checked first. Models without such settings accept any N."""
        self._validate_params()

    def _refuse_graph(self, graph) -> None:
        """For models that do not use a neighbour graph: refuse one rather than ignore it."""
        if graph is not None:
            raise ValueError(
                f"{type(self).__name__} does not use a neighbour graph, but graph= was passed; "
                "call fit(Y) without it (graph models: LLLVM, GLLE)."
            )
