"""The structure's figures, counted the same way for any checkout (issue 49's before/after):
private names imported across modules, files over 600 lines outside tests, imports inside
function bodies (each with the file), bench text lines, and README lines before the layout table.

    python bench/identity/structure.py [ROOT]

Import circles and upward imports are `farm-studio look`'s count; duplicate pairs `duplicates`'.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

CODE = ("flows", "tasks", "lvmcore", "embed_sweep", "bench")


def _files(root: Path, dirs=CODE, suffix=".py"):
    for d in dirs:
        if (root / d).exists():
            yield from sorted(p for p in (root / d).rglob(f"*{suffix}") if ".venv" not in p.parts)


def _module(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def private_imports(root: Path) -> list[str]:
    out = []
    for path in _files(root):
        mod, pkg = _module(root, path), path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = mod.split(".")
                target = ".".join(
                    base[: len(base) - node.level + pkg] + ([node.module] if node.module else [])
                )
            else:
                target = node.module or ""
            if target.split(".")[0] not in CODE or target == mod:
                continue
            for a in node.names:
                if a.name.startswith("_") and not a.name.endswith("__"):
                    out.append(f"{path.relative_to(root)}:{node.lineno} {target}.{a.name}")
    return out


def function_imports(root: Path) -> Counter:
    per_file = Counter()
    for path in _files(root, dirs=("flows", "tasks", "lvmcore", "embed_sweep")):
        inside = set()  # each import once, however deeply its functions nest
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                inside.update(id(s) for s in ast.walk(node) if isinstance(s, ast.Import | ast.ImportFrom))
        if inside:
            per_file[str(path.relative_to(root))] = len(inside)
    return per_file


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    priv = private_imports(root)
    big = [
        (len(p.read_text().splitlines()), str(p.relative_to(root)))
        for p in _files(root, dirs=("flows", "tasks", "lvmcore", "embed_sweep", "bench"))
    ]
    big = sorted((n, p) for n, p in big if n > 600)
    fn = function_imports(root)
    bench_md = sum(len(p.read_text().splitlines()) for p in _files(root, dirs=("bench",), suffix=".md"))
    readme = (root / "README.md").read_text().splitlines()
    first_table = next((i for i, line in enumerate(readme) if line.lstrip().startswith("|")), len(readme))
    print(f"private names imported across modules: {len(priv)}")
    for line in priv:
        print("   ", line)
    print(f"files over 600 lines outside tests: {len(big)}", big)
    print(f"imports inside function bodies (product code): {sum(fn.values())} in {len(fn)} files")
    for f, n in fn.most_common():
        print(f"    {n:3d} {f}")
    print(f"bench text lines (*.md under bench/): {bench_md}")
    print(f"README lines: {len(readme)}; lines before its first table: {first_table}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
