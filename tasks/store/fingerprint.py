"""Hashes that identify what a store's grid points mean: the sweep's identity (``sweep_id``) and the
version of the numerics that computed them (``numerics_version``, recorded per point)."""

from __future__ import annotations

import ast
import functools
import hashlib
import json
from pathlib import Path

import lvmcore

#: what each grid point records of the code that computed it (``numerics`` variable): the version
#: of the numerics, a hash of the abstract syntax trees (docstrings and comments left out) of
#: lvmcore's modules and of the tasks that call them and compute the metrics (tasks/fit.py,
#: tasks/evaluate.py, tasks/registry.py). Two versions that differ there may give other numbers for
#: the same grid point; a store is grown or resumed only by the version of its finished points.
NUMERICS_CHARS = 16
#: the pipeline library's files that ``numerics_version`` hashes beside lvmcore's (paths under tasks/)
NUMERICS_TASK_FILES = ("fit.py", "evaluate.py", "registry.py")


def _strip_docstrings(tree):
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(getattr(body[0], "value", None), ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return tree


@functools.lru_cache(maxsize=1)
def numerics_version() -> str:
    """The version of the numerics this code computes with (see ``NUMERICS_CHARS``): the first 16
    hex digits of a SHA-256 over each source file's path and docstring-free syntax tree."""
    tasks_dir = Path(__file__).resolve().parents[1]
    pkg = Path(lvmcore.__file__).resolve().parent
    files = sorted(pkg.rglob("*.py")) + [tasks_dir / name for name in NUMERICS_TASK_FILES]
    h = hashlib.sha256()
    for f in files:
        rel = f.relative_to(pkg.parent).as_posix()
        h.update(rel.encode() + b"\0")
        h.update(ast.dump(_strip_docstrings(ast.parse(f.read_text(), filename=rel))).encode() + b"\0")
    return h.hexdigest()[:NUMERICS_CHARS]


def sweep_id(identity: dict) -> str:
    """Stable hash of what defines a sweep (dataset, models, options, grid)."""
    blob = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]
