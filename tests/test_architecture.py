"""The dependency direction of DESIGN §2, enforced by import-linter's contracts in pyproject.toml."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _lint_imports() -> str:
    local = Path(sys.executable).parent / "lint-imports"
    found = str(local) if local.exists() else shutil.which("lint-imports")
    assert found, "lint-imports is missing: pip install -e '.[test]'"
    return found


def test_import_contracts_hold() -> None:
    proc = subprocess.run(
        [_lint_imports(), "--no-cache"],
        cwd=ROOT,
        # a lint-imports found on PATH may belong to another interpreter: analyse this tree
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


def test_contracts_are_configured() -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert "[tool.importlinter]" in text
    assert 'type = "layers"' in text
    assert "Engines never import the store" in text
