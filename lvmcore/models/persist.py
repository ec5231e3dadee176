"""Fitted models as plain arrays and back (the estimator contract's ``to_arrays`` /
``from_arrays``), for whoever holds only the arrays and their params: the class is named in the
params and looked up among lvmcore's public estimators, never imported from a stored string."""

from __future__ import annotations

from lvmcore import models


def model_from_arrays(arrays: dict, params: dict, **inputs):
    """The fitted estimator that ``to_arrays`` gave ``(arrays, params)`` for; ``inputs`` are the
    store's training ``data`` / ``graph`` for the families that keep them out of the store."""
    name = params.get("class")
    if name not in models.__all__:
        raise ValueError(f"unknown model class {name!r}; lvmcore's estimators: {', '.join(models.__all__)}")
    return getattr(models, name).from_arrays(arrays, params, **inputs)
