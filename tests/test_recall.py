"""Store-backed recall: one implementation of grep/expand/describe for every engine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from ctxengine.engine import ContextEngine, Services
from ctxengine.messages import Message
from ctxengine.recall import EXPAND_TOOL, GREP_TOOL, LCM_ALIASES, Recall
from ctxengine.storage import RecallStore
from ctxengine.store.sqlite import SqliteStore

LISTING = "\n".join(f"/sys/devices/platform/dev{i}/power" for i in range(200))

HISTORY: list[Message] = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Fix the failing test in src/Foo.java"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "bash", "arguments": '{"command": "find /sys"}'},
            }
        ],
    },
    {
        "role": "tool",
        "tool_call_id": "c1",
        "content": LISTING + "\nError: permission denied on /sys/kernel/debug",
    },
    {"role": "user", "content": "Now run the tests."},
]


@pytest.fixture
def store() -> Iterator[SqliteStore]:
    s = SqliteStore(":memory:")
    yield s
    s.close()


@pytest.fixture
def recall(store: SqliteStore) -> Recall:
    store.record_messages("s1", HISTORY)
    return Recall(store, "s1")


def test_the_sqlite_store_is_a_recall_store(store: SqliteStore) -> None:
    assert isinstance(store, RecallStore)


def test_grep_returns_a_removed_line_verbatim(recall: Recall) -> None:
    answer = json.loads(recall.handle(GREP_TOOL, {"query": "permission denied"}))
    assert answer["count"] >= 1
    assert any(
        "Error: permission denied on /sys/kernel/debug" in r["snippet"] for r in answer["results"]
    )


def test_retrievable_is_true_only_for_recorded_text(recall: Recall) -> None:
    assert recall.retrievable("/sys/devices/platform/dev137/power")
    assert recall.retrievable("Fix the failing test in src/Foo.java")
    assert not recall.retrievable("/never/seen/anywhere.txt")
    assert not recall.retrievable("")


def test_grep_is_scoped_to_the_session(store: SqliteStore) -> None:
    store.record_messages("s1", HISTORY)
    store.record_messages("s2", [{"role": "user", "content": "only in s2: zebra-unique-token"}])
    assert not Recall(store, "s1").retrievable("zebra-unique-token")
    assert Recall(store, "s2").retrievable("zebra-unique-token")
    everywhere = json.loads(
        Recall(store, "s1").handle(GREP_TOOL, {"query": "zebra-unique-token", "scope": "all"})
    )
    assert everywhere["count"] == 1


def test_expand_a_message_id_returns_the_original(store: SqliteStore) -> None:
    ids = store.record_messages("s1", HISTORY)
    answer = json.loads(
        Recall(store, "s1").handle(EXPAND_TOOL, {"id": ids[3], "max_tokens": 100_000})
    )
    assert answer["total"] == 1
    assert answer["messages"][0]["message"]["content"] == HISTORY[3]["content"]


def test_expand_a_node_pages_through_its_originals(store: SqliteStore) -> None:
    ids = store.record_messages("s1", HISTORY)
    store.add_node(
        "s1",
        "n1",
        depth=0,
        text="[ctxengine:node] summary",
        children=[("message", i) for i in ids[1:5]],
    )
    r = Recall(store, "s1")
    first = json.loads(r.handle(EXPAND_TOOL, {"id": "n1", "max_tokens": 100}))
    assert first["total"] == 4 and first["messages"][0]["message"] == HISTORY[1]
    assert first["next_offset"] is not None
    rest = json.loads(
        r.handle(EXPAND_TOOL, {"id": "n1", "offset": first["next_offset"], "max_tokens": 100_000})
    )
    assert [m["message"] for m in first["messages"] + rest["messages"]] == HISTORY[1:5]


def test_unknown_ids_and_bad_arguments_are_errors_for_the_model(recall: Recall) -> None:
    assert "error" in json.loads(recall.handle(EXPAND_TOOL, {"id": "nope"}))
    assert "error" in json.loads(recall.handle(EXPAND_TOOL, {}))
    assert "error" in json.loads(recall.handle(GREP_TOOL, {"query": ""}))
    assert "error" in json.loads(recall.handle(GREP_TOOL, {"query": "x", "mode": "glob"}))
    assert "error" in json.loads(recall.handle(GREP_TOOL, "{not json"))
    assert "error" in json.loads(recall.handle("ctx_unknown", {}))


def test_arguments_may_come_as_a_json_string(recall: Recall) -> None:
    answer = json.loads(recall.handle(GREP_TOOL, json.dumps({"query": "Now run"})))
    assert answer["count"] == 1


def test_lcm_aliases_answer_with_the_same_code(store: SqliteStore) -> None:
    ids = store.record_messages("s1", HISTORY)
    store.add_node(
        "s1", "n1", depth=0, text="[ctxengine:node] summary", children=[("message", ids[1])]
    )
    r = Recall(store, "s1", aliases=LCM_ALIASES)
    names = [s["name"] for s in r.tool_schemas()]
    assert names == ["lcm_grep", "lcm_expand", "lcm_describe"]
    assert json.loads(r.handle("lcm_grep", {"query": "Foo.java"}))["count"] >= 1
    assert (
        json.loads(r.handle("lcm_expand", {"node_id": "n1"}))["messages"][0]["message"]
        == HISTORY[1]
    )
    assert json.loads(r.handle("lcm_describe", {"node_id": "n1"}))["children"][0]["id"] == ids[1]


def test_generic_schemas_are_grep_and_expand(recall: Recall) -> None:
    schemas = recall.tool_schemas()
    assert [s["name"] for s in schemas] == [GREP_TOOL, EXPAND_TOOL]
    assert all(s["parameters"]["type"] == "object" for s in schemas)


def test_an_alias_to_an_unknown_tool_is_refused(store: SqliteStore) -> None:
    with pytest.raises(ValueError, match="points at"):
        Recall(store, "s1", aliases={"my_grep": "ctx_find"})


# -- the ABC additions -------------------------------------------------------------------------
class _Settings(BaseModel):
    threshold: float = 0.5
    keep_last: int = 3


class SettingsEngine(ContextEngine):
    Settings = _Settings

    def __init__(
        self,
        *,
        context_length: int = 1000,
        threshold: float | None = None,
        keep_last: int = 1,
        store: Any = None,
    ) -> None:
        super().__init__(context_length=context_length, threshold=threshold)
        self.keep_last = keep_last
        self.store = store

    @property
    def name(self) -> str:
        return "settings"

    def update_from_response(self, usage: Any) -> None:
        self._record_usage(usage)

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        return False

    def compress(
        self,
        messages: list[Message],
        current_tokens: int | None = None,
        focus_topic: str | None = None,
    ) -> list[Message]:
        return list(messages)


def test_default_from_config_passes_settings_and_the_services_init_accepts(
    store: SqliteStore,
) -> None:
    engine = SettingsEngine.from_config(
        _Settings(threshold=0.25, keep_last=7),
        Services(context_length=8000, store=store, session_id="x"),
    )
    assert isinstance(engine, SettingsEngine)
    assert (engine.context_length, engine.threshold_tokens, engine.keep_last, engine.store) == (
        8000,
        2000,
        7,
        store,
    )


def test_default_from_config_without_settings() -> None:
    engine = SettingsEngine.from_config(None, Services(context_length=4000))
    assert (
        isinstance(engine, SettingsEngine)
        and engine.context_length == 4000
        and engine.keep_last == 1
    )


def test_retrievable_defaults_to_false() -> None:
    assert SettingsEngine().retrievable("anything") is False
