"""The layering rules that tools do not see: no private name imported from another module.

import-linter (``lint-imports`` in .ci/test, contracts in pyproject.toml) holds the layers
flows -> tasks -> lvmcore and keeps prefect out of tasks and lvmcore; ruff's TID251 keeps the
ambient-cluster calls out of lvmcore. Neither looks at the names an import takes: a module that
imports another's ``_private`` name couples itself to that module's insides, so the name should be
public where it lives, or live where it is used. This test walks the product and bench code.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("flows", "tasks", "lvmcore", "embed_sweep", "bench")


def _module_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(source: str, module: str, is_package=False, project=PACKAGES) -> list[tuple[int, str]]:
    """(line, 'from X import _y') for each private name ``module`` imports from another project
    module: a relative import resolved against ``module``, the module's own package excepted only
    where the name is the module itself (``from . import _impl`` inside its package is the package's
    own business)."""
    out = []
    package = module.rsplit(".", 1)[0] if "." in module else ""
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = module.split(".")  # a package's __init__ is its own level-1 anchor
            base = base[: len(base) - node.level + (1 if is_package else 0)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        if target.split(".")[0] not in project or target == module:
            continue
        for alias in node.names:
            if _is_private(alias.name) and not (target == package and node.module is None):
                out.append((node.lineno, f"from {target} import {alias.name}"))
    return out


def _project_files():
    for pkg in PACKAGES:
        base = ROOT / pkg
        if base.exists():
            yield from sorted(p for p in base.rglob("*.py") if ".venv" not in p.parts)


def test_no_private_name_is_imported_across_modules():
    found = []
    for path in _project_files():
        for line, what in private_imports(path.read_text(), _module_of(path), path.name == "__init__.py"):
            found.append(f"{path.relative_to(ROOT)}:{line}: {what}")
    assert not found, "private names imported across modules:\n" + "\n".join(found)


def test_the_check_sees_absolute_and_relative_private_imports():
    """The rule can fail: each spelling of a cross-module private import is caught, a public one
    and a module's import of its own package's private module are not."""
    src = (
        "from lvmcore.psi.closed_form import _rbf, rbf_psi\n"
        "from .operators import _helper\n"
        "from ..kernels import _K as K\n"
        "import lvmcore.graph\n"
        "from tasks.store import open_store\n"
        "from numpy import _core\n"
    )
    hits = private_imports(src, "lvmcore.models.lllvm.qx")
    assert [h[1] for h in hits] == [
        "from lvmcore.psi.closed_form import _rbf",
        "from lvmcore.models.lllvm.operators import _helper",
        "from lvmcore.models.kernels import _K",
    ]
    init = private_imports("from .closed_form import _rbf\n", "lvmcore.psi", is_package=True)
    assert [h[1] for h in init] == ["from lvmcore.psi.closed_form import _rbf"]
