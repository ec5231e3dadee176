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
- ``transform`` never changes the fitted state, and each new point is its own problem: a point's
  answer never depends on which other points are transformed with it.
- ``to_arrays()`` / ``from_arrays()`` turn a fitted model into plain arrays plus JSON-able
  parameters and back, exactly: what a result store keeps of a fitted model (no pickle, nothing
  that executes on load). A family lists the fitted attributes it keeps in ``persisted``; those
  it needs back from the store's inputs (the training rows, the neighbour graph) in
  ``needs_inputs``, and rebuilds derived state in ``_restore``.
- ``score_samples(Y_new)`` is each new point's log predictive density under the model (or the
  family's named equivalent), higher for points the model represents better;
  ``reference_score_stats(Y_train)`` keeps the median and MAD of the training points' scores,
  against which a mapping score is standardised (``mapping_score``).
- ``map_points(Y_new)`` -> (mean, var or None, mapping score): what mapping new cells needs, from
  one solve of each point's q(x*) (or its family's placement). The default is ``transform`` then
  ``mapping_score``, right for families whose score needs no placement (PPCA's closed form); the
  families whose score is a density at the placement (the GP-LVMs, MRD, the hGP-LVMs, LL-LVM,
  GLLE) override it to place each point once and score it there. A model without reference scores,
  or one that cannot score, raises (ValueError / NotImplementedError): never a silent NaN.

``get_params`` / ``set_params`` / ``sklearn.base.clone`` come from ``BaseEstimator``, which reads
the parameter names off the constructor signature: every constructor argument must be stored
under its own name.
"""

from __future__ import annotations

import numbers

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

__all__ = ["MODEL_FORMAT", "REFERENCE_SCORE_CELLS", "LatentModel", "stalled"]

#: the version of the arrays-and-parameters form ``to_arrays`` writes; ``from_arrays`` refuses
#: another, naming both
MODEL_FORMAT = 1
#: training points (a seeded subsample where there are more) whose scores give the reference
#: median and MAD of ``reference_score_stats``
REFERENCE_SCORE_CELLS = 2000


def _json_scalar(name: str, value):
    """A fitted scalar as a JSON value (numpy scalars unwrapped); anything else is refused."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, list | tuple) and all(isinstance(v, bool | str | numbers.Real) for v in value):
        return [_json_scalar(name, v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _json_scalar(f"{name}[{k!r}]", v) for k, v in value.items()}
    kind = type(value).__name__
    raise TypeError(f"fitted attribute {name} of type {kind} is neither an array nor a JSON value")


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

    # --- the fitted model as plain arrays (what a result store keeps) ---------------------------

    #: the fitted attributes ``to_arrays`` keeps (arrays, or JSON-able scalars / lists / dicts)
    persisted: tuple[str, ...] = ("embedding_", "embedding_var_", "elbo_", "n_iter_", "converged_")
    #: inputs ``from_arrays`` needs back from the store, not copied into it: "data" (the training
    #: rows), "graph" (the neighbour indices the fit used)
    needs_inputs: tuple[str, ...] = ()

    def to_arrays(self) -> tuple[dict, dict]:
        """(arrays, params): each kept fitted attribute that is an array under its name, float64
        or int64; the constructor's parameters, the scalars and the class and format under params.
        A fitted attribute of another type is refused (TypeError) rather than dropped."""
        self._check_fitted()
        arrays, fitted = {}, {}
        for name in self.persisted:
            value = getattr(self, name, None)
            if isinstance(value, np.ndarray):
                arrays[name] = value
            else:
                fitted[name] = _json_scalar(name, value)
        params = {
            "class": type(self).__name__,
            "format": MODEL_FORMAT,
            "params": {k: _json_scalar(k, v) for k, v in self.get_params(deep=False).items()},
            "fitted": fitted,
            "needs_inputs": list(self.needs_inputs),
        }
        return arrays, params

    @classmethod
    def from_arrays(cls, arrays: dict, params: dict, **inputs):
        """The fitted model back from ``to_arrays``' output (and, for families that keep them out
        of the store, the training ``data`` and ``graph``): every output equals the original's."""
        if params.get("class") != cls.__name__:
            raise ValueError(f"these arrays hold a {params.get('class')!r}, not a {cls.__name__}")
        if params.get("format") != MODEL_FORMAT:
            raise ValueError(
                f"model format {params.get('format')!r} is not this version's ({MODEL_FORMAT}); "
                "refit the sweep's models with this version (embed-sweep run ... --refit-models)"
            )
        missing = [k for k in cls.needs_inputs if inputs.get(k) is None]
        if missing:
            raise ValueError(f"{cls.__name__}.from_arrays needs the store's inputs {missing}")
        est = cls(**params["params"])
        for name, value in params.get("fitted", {}).items():
            setattr(est, name, value)
        for name, value in arrays.items():
            setattr(est, name, np.asarray(value))
        est._restore(**{k: inputs[k] for k in cls.needs_inputs})
        return est

    def _restore(self, **inputs) -> None:
        """Rebuild derived state after ``from_arrays`` (factors, the inputs a family keeps out of
        the store). Nothing to do for models whose kept arrays are their whole state."""

    def score_samples(self, Y_new) -> np.ndarray:
        """Each new point's log predictive density (module docstring)."""
        raise NotImplementedError(f"{type(self).__name__} has no score_samples")

    def reference_score_stats(self, Y_train, random_state: int = 0) -> tuple[float, float]:
        """Median and MAD of ``score_samples`` over at most ``REFERENCE_SCORE_CELLS`` training
        points (a seeded subsample): the reference a mapping score is standardised against,
        kept as ``score_reference_``."""
        Y_train = np.asarray(Y_train) if not isinstance(Y_train, list) else Y_train
        n = len(Y_train[0]) if isinstance(Y_train, list) else len(Y_train)
        rows = np.arange(n)
        if n > REFERENCE_SCORE_CELLS:
            rng = np.random.default_rng(random_state)
            rows = np.sort(rng.choice(n, REFERENCE_SCORE_CELLS, replace=False))
        sub = [np.asarray(v)[rows] for v in Y_train] if isinstance(Y_train, list) else Y_train[rows]
        s = np.asarray(self.score_samples(sub), dtype=float)
        med = float(np.median(s))
        mad = float(np.median(np.abs(s - med)))
        self.score_reference_ = [med, mad if mad > 0 else 1.0]
        return med, self.score_reference_[1]

    def reference_pair(self, Y_new) -> tuple[float, float]:
        """The (median, MAD) that new points ``Y_new``'s scores are standardised against; a model
        without reference scores raises, naming the call that makes them."""
        med, mad = getattr(self, "score_reference_", None) or (None, None)
        if med is None:
            raise ValueError(
                f"{type(self).__name__} has no reference scores; call reference_score_stats(Y_train)"
            )
        return med, mad

    def standardised(self, scores, Y_new) -> np.ndarray:
        """Scores of ``Y_new`` (``score_samples``') as mapping scores: (score - median) / MAD."""
        med, mad = self.reference_pair(Y_new)
        return (np.asarray(scores, dtype=float) - med) / mad

    def mapping_score(self, Y_new) -> np.ndarray:
        """(score_samples - reference median) / reference MAD: higher = better represented."""
        self.reference_pair(Y_new)  # refused before any work where there are no reference scores
        return self.standardised(self.score_samples(Y_new), Y_new)

    def map_points(self, Y_new):
        """(latent means (n, Q), variances (n, Q) or None, mapping scores (n,)) of new points
        (module docstring): here ``transform`` and ``mapping_score``, for families whose score
        does not need the placement (the score first: a model that cannot score is refused before
        the transform's work)."""
        score = self.mapping_score(Y_new)
        out = self.transform(Y_new, return_var=True)
        mean, var = out if isinstance(out, tuple) else (out, None)
        return mean, var, score
