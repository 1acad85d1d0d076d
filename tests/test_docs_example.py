"""docs/architecture.md's example engine is real code: it imports, keeps the engine contract and
matches the text of the page."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from ctxengine.engine import Services
from ctxengine.engines.kit.originals import Originals
from ctxengine.store import SqliteStore
from ctxengine.testing import check_engine_contract

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("example_engine", DOCS / "example_engine.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_page_shows_the_tested_code() -> None:
    code = (DOCS / "example_engine.py").read_text(encoding="utf-8")
    page = (DOCS / "architecture.md").read_text(encoding="utf-8")
    body = code.split('"""', 2)[2].strip()
    assert body in page


def test_the_example_keeps_the_engine_contract() -> None:
    mod = _example()
    report = check_engine_contract(lambda: mod.TrimEngine(context_length=4000, originals=Originals(SqliteStore(":memory:"), "s")), examples=15)
    assert report.turn_compactions > 0


def test_the_example_builds_from_settings_and_services() -> None:
    mod = _example()
    eng = mod.TrimEngine.from_config(mod.TrimSettings(keep_recent=1), Services(context_length=8000, store=SqliteStore(":memory:")))
    assert eng.settings.keep_recent == 1 and eng.context_length == 8000 and eng.originals is not None
    msgs = [{"role": "user", "content": "go"}]
    for k in range(3):
        msgs += [
            {"role": "assistant", "content": None, "tool_calls": [{"id": f"c{k}", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"c{k}", "content": "\n".join(f"/srv/app/f{k}_{i}.py" for i in range(400))},
        ]
    out = eng.compress(msgs)
    assert out[2]["content"].startswith("[ctxengine:cut ref=") and out[-1] == msgs[-1]
    assert eng.retrievable("/srv/app/f0_200.py")


def test_the_example_registers_like_any_engine() -> None:
    from ctxengine.registry import EngineRegistry

    mod = _example()
    reg = EngineRegistry(entry_points=False)
    reg.register_engine_class("trim", mod.TrimEngine, "docs example")
    eng = reg.create("trim", context_length=6000, store=SqliteStore(":memory:"))
    assert isinstance(eng, mod.TrimEngine) and eng.context_length == 6000 and eng.originals is not None
    assert eng.settings == mod.TrimSettings()  # no trim: section in a config file: the model's defaults
