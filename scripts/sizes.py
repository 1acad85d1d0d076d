"""List the modules, classes and functions of src/ctxengine over the size limits.

The limits (docs/architecture.md): no module over 600 lines, no class over 400, no function over
60. A size is the span of the node in the source (``end_lineno - lineno + 1``, decorators and
docstrings included); a module's size is its line count.

    python scripts/sizes.py            # every finding, one a line; exit 1 if any
    python scripts/sizes.py --root DIR # another package folder
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "ctxengine"

MODULE_LIMIT = 600
CLASS_LIMIT = 400
FUNCTION_LIMIT = 60


@dataclass(frozen=True)
class Finding:
    """One node over its limit: ``kind`` is module, class or function."""

    path: str
    kind: str
    name: str
    lines: int
    limit: int

    def __str__(self) -> str:
        where = self.path if self.kind == "module" else f"{self.path}:{self.name}"
        return f"{self.kind:8} {self.lines:5} > {self.limit:3}  {where}"


def _nodes(tree: ast.AST, prefix: str = "") -> list[tuple[str, ast.AST]]:
    """Every class and function below ``tree`` with its dotted name (nested ones included)."""
    found: list[tuple[str, ast.AST]] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}{node.name}"
            found.append((name, node))
            found.extend(_nodes(node, f"{name}."))
        else:
            found.extend(_nodes(node, prefix))
    return found


def check_file(path: Path, shown: str) -> list[Finding]:
    """The findings of one source file, ``shown`` being the path to print."""
    text = path.read_text(encoding="utf-8")
    findings: list[Finding] = []
    length = len(text.splitlines())
    if length > MODULE_LIMIT:
        findings.append(Finding(shown, "module", shown, length, MODULE_LIMIT))
    for name, node in _nodes(ast.parse(text, filename=str(path))):
        assert isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        size = (node.end_lineno or node.lineno) - node.lineno + 1
        is_class = isinstance(node, ast.ClassDef)
        limit = CLASS_LIMIT if is_class else FUNCTION_LIMIT
        if size > limit:
            findings.append(Finding(shown, "class" if is_class else "function", name, size, limit))
    return findings


def check_tree(package: Path = PACKAGE) -> list[Finding]:
    """The findings of every ``.py`` file below ``package``, paths shown relative to its parent."""
    findings: list[Finding] = []
    for path in sorted(package.rglob("*.py")):
        findings.extend(check_file(path, path.relative_to(package.parent).as_posix()))
    return findings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=PACKAGE, help="the package folder to check")
    args = parser.parse_args(argv)
    if not args.root.is_dir():
        parser.error(f"--root {args.root} is not a folder")
    findings = check_tree(args.root)
    for finding in findings:
        print(finding)
    print(f"{len(findings)} over the limits", file=sys.stderr)
    return 1 if findings else 0


if __name__ == "__main__":
    raise SystemExit(main())
