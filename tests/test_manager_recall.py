"""Recall for every engine: offered once the context lost text (with a store), answered by the
manager, never while holding the session lock."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from ctxengine.config import Config
from ctxengine.engine import ContextEngine
from ctxengine.manager import ContextManager
from ctxengine.messages import Message
from ctxengine.recall import GREP_TOOL
from ctxengine.store.sqlite import SqliteStore


class Dropper(ContextEngine):
    """Keeps the system prompt, the user messages and the last exchange when asked."""

    def __init__(self, *, context_length: int = 4000, fire: bool = False) -> None:
        super().__init__(context_length=context_length)
        self.fire = fire

    @property
    def name(self) -> str:
        return "dropper"

    def update_from_response(self, usage: Any) -> None:
        self._record_usage(usage)

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        return self.fire

    def compress(
        self,
        messages: list[Message],
        current_tokens: int | None = None,
        focus_topic: str | None = None,
    ) -> list[Message]:
        keep = [m for m in messages if m.get("role") in ("system", "user")]
        return keep


def _history() -> list[Message]:
    return [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "look at the logs"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "c1",
            "content": "line one\nFATAL: disk quota exceeded in /var/lib/app/data.db\nline three",
        },
        {"role": "user", "content": "what failed?"},
    ]


def _mgr(store: Any, fire: bool) -> ContextManager:
    return ContextManager(
        Config(),
        model="gpt-4o",
        context_length=4000,
        store=store,
        engine_factory=lambda: Dropper(fire=fire),
    )


def _names(tools: list[dict[str, Any]]) -> list[str]:
    return [t["function"]["name"] for t in tools]


def test_no_recall_tools_before_anything_was_removed() -> None:
    mgr = _mgr(SqliteStore(":memory:"), fire=False)
    mgr.prepare(_history())
    assert _names(mgr.tools([])) == []
    assert mgr.status()["recall_offered"] is False


def test_no_recall_tools_without_a_store() -> None:
    mgr = _mgr(None, fire=True)
    mgr.prepare(_history())
    assert _names(mgr.tools([])) == []


def test_recall_tools_once_text_was_removed_and_the_model_gets_its_answer() -> None:
    mgr = _mgr(SqliteStore(":memory:"), fire=True)
    out = mgr.prepare(_history())
    assert "FATAL" not in json.dumps(out)
    tools = mgr.tools([{"type": "function", "function": {"name": "bash", "parameters": {}}}])
    assert _names(tools) == ["bash", "ctx_grep", "ctx_expand"]
    assert mgr.retrievable("FATAL: disk quota exceeded in /var/lib/app/data.db")
    # the model calls ctx_grep; the next prepare answers it before anything else
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "r1",
                "type": "function",
                "function": {"name": GREP_TOOL, "arguments": json.dumps({"query": "FATAL"})},
            }
        ],
    }
    mgr.engine().fire = False  # type: ignore[attr-defined]
    nxt = mgr.prepare([*out, call])
    assert nxt[-1]["role"] == "tool" and nxt[-1]["tool_call_id"] == "r1"
    assert (
        "FATAL: disk quota exceeded in /var/lib/app/data.db"
        in json.loads(nxt[-1]["content"])["results"][0]["snippet"]
    )


def test_a_search_does_not_hold_the_session_lock() -> None:
    store = SqliteStore(":memory:")
    mgr = _mgr(store, fire=True)
    out = mgr.prepare(_history())
    s = mgr._session(None)
    held: list[bool] = []
    recall = s.recall
    assert recall is not None
    original = recall.handle

    def probe(name: str, args: Any) -> str:
        # another thread can take the session lock while the search runs
        got = threading.Event()

        def take() -> None:
            with s.lock:
                got.set()

        t = threading.Thread(target=take)
        t.start()
        held.append(got.wait(2))
        t.join()
        return original(name, args)

    recall.handle = probe  # type: ignore[method-assign]
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "r1",
                "type": "function",
                "function": {"name": GREP_TOOL, "arguments": '{"query": "FATAL"}'},
            }
        ],
    }
    mgr.prepare([*out, call])
    assert held == [True]


def test_an_engine_with_its_own_recall_tools_is_not_offered_a_second_set() -> None:
    class OwnRecall(Dropper):
        def get_tool_schemas(self) -> list[dict[str, Any]]:
            return [
                {
                    "name": "lcm_grep",
                    "description": "x",
                    "parameters": {"type": "object", "properties": {}},
                }
            ]

    store = SqliteStore(":memory:")
    mgr = ContextManager(
        Config(),
        model="gpt-4o",
        context_length=4000,
        store=store,
        engine_factory=lambda: OwnRecall(fire=True),
    )
    mgr.prepare(_history())
    assert _names(mgr.tools([])) == ["lcm_grep"]


def test_flushing_a_session_that_lost_text_indexes_its_identifiers(tmp_path: Path) -> None:
    """The identifier index is built after the response (flush_records), not by the next search."""
    store = SqliteStore(tmp_path / "s.db")
    mgr = ContextManager(Config(), model="gpt-4o", context_length=8_000, store=store)
    msgs: list[Message] = [{"role": "system", "content": "agent"}, {"role": "user", "content": "fix it"}]
    for k in range(8):
        msgs += [
            {"role": "assistant", "content": None, "tool_calls": [{"id": f"c{k}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"c{k}", "content": f"/srv/app/module{k}/handler{k}.py\n" + "line of output\n" * 300},
        ]
        mgr.prepare(list(msgs), session_id="s", defer_record=True)
        mgr.flush_records("s")
    assert mgr.status("s")["compactions"] + mgr.status("s")["window_cuts"] >= 1
    assert store.unindexed_texts("s", limit=10) == []
    store.close()
