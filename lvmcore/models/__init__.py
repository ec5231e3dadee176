"""Estimators. Each model lives in its own module; the names below are the stable public API."""

from importlib import import_module

_MODELS = {
    "LLLVM": "lvmcore.models.lllvm",
    "GLLE": "lvmcore.models.glle",
    "BayesianGPLVM": "lvmcore.models.bgplvm",
    "MRD": "lvmcore.models.mrd",
    "HyperboloidGPLVM": "lvmcore.models.hgplvm",
    "PPCA": "lvmcore.models.ppca",
    "StochasticBayesianGPLVM": "lvmcore.models.bgplvm_svi",
    "BayesianHyperboloidGPLVM": "lvmcore.models.hgplvm",
}

__all__ = list(_MODELS)


def __getattr__(name):
    if name in _MODELS:
        return getattr(import_module(_MODELS[name]), name)
    raise AttributeError(f"module 'lvmcore.models' has no attribute {name!r}")
