"""The size limits of docs/architecture.md (no module over 600 lines, no class over 400, no
function over 60), measured by scripts/sizes.py, with every exception named."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]

# (path, name) of the nodes allowed over their limit, and why. Remove an entry when its node
# shrinks; an entry whose node is gone or small again is reported by the last test.
ALLOWED: dict[tuple[str, str], str] = {
    # the public facade: about thirty public methods of a few lines each, delegating to the
    # kernel's stages; their docstrings are the API reference (prepare's body is four lines)
    ("ctxengine/manager.py", "ContextManager"): "public facade, documented",
    ("ctxengine/manager.py", "ContextManager.prepare"): "public facade, documented",
    # being split by the engine redesign of issue 25 (its methods are within the limit but
    # the constructor)
    ("ctxengine/engines/compressor.py", "SummaryCompressor"): "engine redesign",
    # its keyword list mirrors the constructor of Hermes' ContextCompressor: a public contract
    ("ctxengine/engines/compressor.py", "SummaryCompressor.__init__"): "Hermes' constructor",
    # the proxy's request path and its fail-open handling, being reworked
    ("ctxengine/proxy/relay.py", "Relaying._relay"): "proxy fail-open rework",
}


def _sizes() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sizes_script", ROOT / "scripts" / "sizes.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def test_nothing_is_over_the_limits_but_the_named_exceptions() -> None:
    findings = _sizes().check_tree(ROOT / "src" / "ctxengine")
    over = [str(f) for f in findings if (f.path, f.name) not in ALLOWED]
    assert not over, "over the size limits (split it, or name it in ALLOWED with the reason):\n" + "\n".join(over)


def test_the_checker_measures_what_it_reports(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(61))
    (package / "long.py").write_text(f"class Small:\n    def long(self) -> None:\n{body.replace('    ', '        ')}\n\n\ndef short() -> None:\n    pass\n")
    findings = _sizes().check_tree(package)
    assert [(f.kind, f.name, f.lines) for f in findings] == [("function", "Small.long", 62)]


def test_every_exception_is_still_needed() -> None:
    findings = {(f.path, f.name) for f in _sizes().check_tree(ROOT / "src" / "ctxengine")}
    stale = sorted(set(ALLOWED) - findings)
    assert not stale, f"these are within the limits now: remove them from ALLOWED: {stale}"
