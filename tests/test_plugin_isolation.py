"""Plugins cannot take the host down (issue 13.7): sys.exit on import, a raise in __init__ or
compress, a mutated input, a compress that never returns."""

from __future__ import annotations

import copy
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ctxengine.config import Config
from ctxengine.engine import ContextEngine
from ctxengine.errors import EngineError, EngineStartError
from ctxengine.loop import engine_busy, run_compress
from ctxengine.manager import ContextManager
from ctxengine.messages import Message
from ctxengine.registry import EngineRegistry

RELEASE = threading.Event()


def _history(n: int = 30) -> list[Message]:
    msgs: list[Message] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "do it"},
    ]
    for k in range(n):
        msgs.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{k}",
                        "type": "function",
                        "function": {"name": "run", "arguments": "{}"},
                    }
                ],
            }
        )
        msgs.append({"role": "tool", "tool_call_id": f"c{k}", "content": "word " * 40})
    return msgs


class Plugin(ContextEngine):
    """Fires on every turn; ``mode`` says how it misbehaves in compress."""

    mode = "ok"

    @property
    def name(self) -> str:
        return "bad"

    def update_from_response(self, usage: Any) -> None:
        self._record_usage(usage)

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        return True

    def compress(
        self,
        messages: list[Message],
        current_tokens: int | None = None,
        focus_topic: str | None = None,
    ) -> list[Message]:
        if self.mode == "raise":
            raise RuntimeError("plugin bug")
        if self.mode == "exit":
            raise SystemExit(3)
        if self.mode == "typeerror":
            raise TypeError("inside compress")
        if self.mode == "mutate":
            messages[1]["content"] = "edited"
            return list(messages)
        if self.mode == "hang":
            RELEASE.wait(30)
        return [messages[0], messages[1]]


def _plugin(mode: str) -> Plugin:
    p = Plugin(context_length=4000)
    p.mode = mode
    return p


def _mgr(mode: str, **cfg: Any) -> ContextManager:
    config = Config.from_dict({"context": cfg}) if cfg else Config()
    return ContextManager(
        config, model="gpt-4o", context_length=4000, engine_factory=lambda: _plugin(mode)
    )


@pytest.mark.parametrize("mode", ["raise", "exit", "typeerror", "mutate"])
def test_a_failing_compress_is_an_engine_error_and_the_callers_data_is_untouched(mode: str) -> None:
    msgs = _history()
    before = copy.deepcopy(msgs)
    with pytest.raises(EngineError, match="'bad'"):
        _mgr(mode).prepare(msgs)
    assert msgs == before


def test_a_type_error_inside_compress_is_not_retried() -> None:
    calls = []

    class Counting(Plugin):
        def compress(
            self,
            messages: list[Message],
            current_tokens: int | None = None,
            focus_topic: str | None = None,
        ) -> list[Message]:
            calls.append(1)
            raise TypeError("bug")

    mgr = ContextManager(
        Config(),
        model="gpt-4o",
        context_length=4000,
        engine_factory=lambda: Counting(context_length=4000),
    )
    with pytest.raises(EngineError, match="TypeError: bug"):
        mgr.prepare(_history())
    assert len(calls) == 1


def test_a_seed_era_compress_without_focus_topic_still_works() -> None:
    class Old(Plugin):
        def compress(
            self, messages: list[Message], current_tokens: int | None = None
        ) -> list[Message]:  # type: ignore[override]
            return [messages[0], messages[1]]

    mgr = ContextManager(
        Config(),
        model="gpt-4o",
        context_length=4000,
        engine_factory=lambda: Old(context_length=4000),
    )
    assert len(mgr.prepare(_history(), focus_topic="x")) == 2


def test_a_compress_that_never_returns_hits_the_deadline() -> None:
    RELEASE.clear()
    mgr = _mgr("hang", engine_timeout=0.3)
    t0 = time.perf_counter()
    with pytest.raises(EngineError, match=r"did not return from compress within 0.3 s"):
        mgr.prepare(_history())
    assert time.perf_counter() - t0 < 5
    engine = mgr.engine()
    assert engine_busy(engine)
    with pytest.raises(EngineError, match="still running"):
        run_compress(engine, _history(), deadline=0.1)
    RELEASE.set()


def test_the_fallback_engine_takes_over_and_the_reason_is_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    mgr = _mgr("raise", fallback_engine="rules")
    out = mgr.prepare(_history())
    assert isinstance(out, list) and out[1] == _history()[1]
    st = mgr.status()
    assert st["engine"] == "rules" and "plugin bug" in st["fallback_reason"]
    assert "replaced by the fallback 'rules'" in caplog.text


def test_engines_get_a_copy_of_the_input() -> None:
    seen: list[list[Message]] = []

    class Spy(Plugin):
        def compress(
            self,
            messages: list[Message],
            current_tokens: int | None = None,
            focus_topic: str | None = None,
        ) -> list[Message]:
            seen.append(messages)
            return [messages[0], messages[1]]

    msgs = _history()
    ContextManager(
        Config(),
        model="gpt-4o",
        context_length=4000,
        engine_factory=lambda: Spy(context_length=4000),
    ).prepare(msgs)
    assert seen and seen[0] is not msgs and seen[0][1] is not msgs[1]


def _dir_plugin(tmp_path: Path, name: str, body: str) -> Config:
    d = tmp_path / "plugins" / "context_engine" / name
    d.mkdir(parents=True)
    (d / "__init__.py").write_text(body, encoding="utf-8")
    return Config.from_dict(
        {
            "context": {"engine": name},
            "plugins": {"dirs": [str(tmp_path / "plugins")], "entry_points": False},
        }
    )


def test_sys_exit_on_import_is_an_engine_error_naming_the_plugin(tmp_path: Path) -> None:
    cfg = _dir_plugin(tmp_path, "quitter", "import sys\nsys.exit(2)\n")
    with pytest.raises(EngineStartError, match=r"plugin 'quitter' .* failed to load: SystemExit"):
        ContextManager(cfg, model="gpt-4o", context_length=4000, store=None).prepare(_history(1))


def test_a_raise_in_init_is_an_engine_error_or_the_fallback(tmp_path: Path) -> None:
    body = (
        "from ctxengine.engine import ContextEngine\n"
        "class Boom(ContextEngine):\n"
        "    name = 'boom'\n"
        "    def __init__(self, **kw):\n"
        "        raise RuntimeError('no GPU')\n"
        "    def update_from_response(self, usage): pass\n"
        "    def should_compress(self, prompt_tokens=None): return False\n"
        "    def compress(self, messages, current_tokens=None, focus_topic=None): return messages\n"
    )
    cfg = _dir_plugin(tmp_path, "boom", body)
    with pytest.raises(EngineError, match=r"'boom' .*failed to start: RuntimeError: no GPU"):
        ContextManager(cfg, model="gpt-4o", context_length=4000, store=None).prepare(_history(1))
    fb = cfg.with_overrides(context={"engine": "boom", "fallback_engine": "compressor"})
    mgr = ContextManager(fb, model="gpt-4o", context_length=4000, store=None)
    mgr.prepare(_history(1))
    assert mgr.engine().name == "compressor"


def test_plugin_engines_are_built_per_session() -> None:
    reg = EngineRegistry(entry_points=False)
    proto = _plugin("ok")
    reg.register_plugin(lambda ctx: ctx.register_context_engine(proto), "my-plugin")
    mgr = ContextManager(
        Config.from_dict({"context": {"engine": "bad"}}),
        model="gpt-4o",
        context_length=4000,
        registry=reg,
        store=None,
    )
    a, b = mgr.engine("a"), mgr.engine("b")
    assert a is not b and a is not proto and b is not proto
    mgr.update_from_response({"prompt_tokens": 1234}, session_id="a")
    assert a.last_prompt_tokens == 1234 and b.last_prompt_tokens == 0


def test_errors_name_where_the_plugin_comes_from() -> None:
    reg = EngineRegistry(entry_points=False)
    reg.register_plugin(lambda ctx: ctx.register_context_engine(_plugin("raise")), "my-plugin 1.0")
    mgr = ContextManager(
        Config.from_dict({"context": {"engine": "bad"}}),
        model="gpt-4o",
        context_length=4000,
        registry=reg,
        store=None,
    )
    with pytest.raises(
        EngineError, match=r"'bad' \(from my-plugin 1.0\) failed in compress: RuntimeError"
    ):
        mgr.prepare(_history())
    assert json.dumps(mgr.status())  # status still works after the failure
