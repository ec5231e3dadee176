"""Code lines of the GP-LVM engine (issue 34): lines that hold Python code, not counting
docstrings, comments or blank lines, per file and in total.

The set: ``lvmcore/models/hgplvm*.py``, ``bgplvm*.py``, ``mrd.py``, ``collapsed.py``,
``uncollapsed.py``, ``kernels/*.py``, ``psi/*.py``, ``optim.py``, ``pca.py`` (the issue's goal:
at most 2,000).

    .venv/bin/python bench/engine_lines.py            # the working tree
    .venv/bin/python bench/engine_lines.py --rev a0a3123   # a commit, read through git show
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import io
import subprocess
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PATTERNS = (
    "lvmcore/models/hgplvm*.py",
    "lvmcore/models/bgplvm*.py",
    "lvmcore/models/mrd.py",
    "lvmcore/collapsed.py",
    "lvmcore/uncollapsed.py",
    "lvmcore/kernels/*.py",
    "lvmcore/psi/*.py",
    "lvmcore/optim.py",
    "lvmcore/pca.py",
)
_SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
_SKIP.add(tokenize.ENDMARKER)


def code_lines(source: str) -> int:
    """Lines holding at least one token that is neither a comment nor part of a docstring."""
    doc = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    doc.update(range(body[0].lineno, body[0].end_lineno + 1))
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in _SKIP:
            continue
        lines.update(r for r in range(tok.start[0], tok.end[0] + 1) if r not in doc)
    return len(lines)


def files(rev: str | None) -> list[str]:
    if rev is None:
        names = [str(p.relative_to(ROOT)) for p in ROOT.glob("lvmcore/**/*.py")]
    else:
        out = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, "lvmcore"], cwd=ROOT,
                             capture_output=True, text=True, check=True)  # fmt: skip
        names = out.stdout.split()
    return sorted(n for n in names if any(fnmatch.fnmatch(n, p) for p in PATTERNS))


def read(name: str, rev: str | None) -> str:
    if rev is None:
        return (ROOT / name).read_text()
    return subprocess.run(["git", "show", f"{rev}:{name}"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default=None, help="a git revision (default: the working tree)")
    a = ap.parse_args()
    total = 0
    for name in files(a.rev):
        n = code_lines(read(name, a.rev))
        total += n
        print(f"{n:6d}  {name}")
    print(f"{total:6d}  total ({a.rev or 'working tree'})")


if __name__ == "__main__":
    main()
