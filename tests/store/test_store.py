"""The store contract, run against SQLite and PostgreSQL (the ``backend`` fixture param)."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from ctxengine.errors import InputError, NotFoundError, StoreError
from ctxengine.storage import NodeSpec, SessionRecorder
from ctxengine.store import EXPORT_FORMAT, SessionStore
from ctxengine.store.base import blob_hash, canonical_json, message_id
from ctxengine.store.migrations import latest_version


def _conversation(n_turns: int = 3, tag: str = "") -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": f"You are a coding agent{tag}."}]
    for t in range(n_turns):
        cid = f"call_{t}"
        msgs += [
            {"role": "user", "content": f"turn {t}{tag}: please open src/pkg/mod{t}.py"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": cid, "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"path": f"src/pkg/mod{t}.py"})}}],
                "reasoning_content": f"thinking {t}",
            },
            {"role": "tool", "tool_call_id": cid, "content": f"line 1\nValueError: bad value {t}\nsee https://example.com/docs/{t}"},
            {"role": "assistant", "content": f"Found the bug in turn {t}.", "x_provider_extra": {"keep": [1, 2]}},
        ]
    return msgs


def test_implements_the_recorder_protocol(store: SessionStore) -> None:
    assert isinstance(store, SessionRecorder)


def test_record_is_content_addressed_and_parent_linked(store: SessionStore) -> None:
    msgs = _conversation(2)
    ids = store.record_messages("s1", msgs)
    assert len(ids) == len(set(ids)) == len(msgs)
    parent = None
    for m, mid in zip(msgs, ids, strict=True):
        assert mid == message_id(parent, blob_hash(canonical_json(m)))
        parent = mid
    assert store.history("s1") == msgs
    assert store.history_ids("s1") == ids


def test_resending_history_adds_only_new_messages(store: SessionStore) -> None:
    msgs = _conversation(3)
    first = store.record_messages("s1", msgs[:5])
    again = store.record_messages("s1", msgs)
    assert again[:5] == first
    info = store.get_session("s1")
    assert info.stored == len(msgs)  # nothing stored twice
    assert info.length == len(msgs)
    assert info.tip == again[-1]
    # re-sending the same history moves nothing: no new event
    n_events = len(store.events("s1"))
    store.record_messages("s1", msgs)
    assert len(store.events("s1")) == n_events


def test_sessions_sharing_a_prefix_share_rows(store: SessionStore) -> None:
    msgs = _conversation(2)
    a = store.record_messages("a", msgs)
    b = store.record_messages("b", [*msgs[:3], {"role": "user", "content": "fork"}])
    assert b[:3] == a[:3]
    assert b[3] != a[3]
    assert store.history("b")[-1] == {"role": "user", "content": "fork"}
    assert {s.id for s in store.list_sessions()} == {"a", "b"}


def test_unknown_keys_and_unicode_survive(store: SessionStore) -> None:
    msgs = [
        {"role": "user", "content": [{"type": "text", "text": "数据库连接失败 — ünïcode"}, {"type": "image_url", "image_url": {"url": "data:x"}}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "sig=="}], "weird": None},
    ]
    store.record_messages("u", msgs)
    assert store.history("u") == msgs


def test_compaction_is_an_event_and_every_point_restores(store: SessionStore) -> None:
    msgs = _conversation(3)
    store.record_messages("s", msgs)
    summary = {"role": "user", "content": "[ctxengine:lcm node=n1] summary of turns 0-1"}
    after = [msgs[0], summary, *msgs[9:]]
    report = {"engine": "lcm", "tokens_before": 900, "tokens_after": 300, "replaced": list(range(1, 9)), "config": {"threshold": 0.75}}
    cid = store.record_compaction("s", report, msgs, after)
    later = [*after, {"role": "user", "content": "next"}]
    store.record_messages("s", later)

    comps = store.compactions("s")
    assert [c.id for c in comps] == [cid]
    c = comps[0]
    before_ids = store.history_ids("s", f"before:{cid}")
    assert c.engine == "lcm" and c.config == {"threshold": 0.75}
    assert (c.tokens_before, c.tokens_after) == (900, 300)
    assert c.replaced == before_ids[1:9]
    assert store.get_compaction(cid) == c

    assert store.history("s", f"before:{cid}") == msgs
    assert store.history("s", f"after:{cid}") == after
    assert store.history("s") == later
    kinds = [e.kind for e in store.events("s")]
    assert kinds == ["messages", "compaction", "messages"]
    assert store.history("s", "event:1") == msgs
    assert store.history("s", "event:2") == after
    # the originals: the compaction undone, later messages kept
    assert store.originals("s") == [*msgs, {"role": "user", "content": "next"}]
    # originals were never edited
    assert store.get_messages(before_ids) == msgs


def test_originals_through_two_compactions(store: SessionStore) -> None:
    msgs = _conversation(4)
    store.record_messages("s", msgs)
    s1 = {"role": "user", "content": "[ctxengine:lcm node=a] first"}
    after1 = [msgs[0], s1, *msgs[5:]]
    store.record_compaction("s", {"engine": "lcm"}, msgs, after1)
    grown = [*after1, {"role": "user", "content": "more"}]
    store.record_messages("s", grown)
    s2 = {"role": "user", "content": "[ctxengine:lcm node=b] second"}
    after2 = [msgs[0], s2, grown[-1]]
    c2 = store.record_compaction("s", {"engine": "lcm"}, grown, after2)
    assert store.history("s") == after2
    assert store.history("s", f"before:{c2}") == grown
    assert store.originals("s") == [*msgs, {"role": "user", "content": "more"}]


@pytest.mark.parametrize("kept", [1, 2])
def test_originals_of_a_branch_off_what_a_compaction_kept_verbatim(store: SessionStore, kept: int) -> None:
    """A turn that edits a message the last compaction kept verbatim (aider resends its newest
    user message without the reminder it appended): the originals are the history before the
    compaction up to the edit, then the new branch."""
    msgs = [*_conversation(2), {"role": "user", "content": "now fix it\n\n(reminder)"}]
    store.record_messages("s", msgs)
    summary = {"role": "assistant", "content": "[CONTEXT COMPACTION] summary"}
    after = [msgs[0], summary, *msgs[-kept:]]
    store.record_compaction("s", {"engine": "x"}, msgs, after)
    resent = {"role": "user", "content": "now fix it"}
    branch = [*after[:-1], resent, {"role": "assistant", "content": "done"}, {"role": "user", "content": "next\n\n(reminder)"}]
    store.record_messages("s", branch)
    assert store.history("s") == branch
    assert store.originals("s") == [*msgs[:-1], *branch[-3:]]


def test_restore_moves_the_tip_without_losing_anything(store: SessionStore) -> None:
    msgs = _conversation(2)
    store.record_messages("s", msgs)
    after = [msgs[0], {"role": "user", "content": "[ctxengine:lcm node=z] s"}]
    cid = store.record_compaction("s", {"engine": "x"}, msgs, after)
    restored = store.restore("s", f"before:{cid}")
    assert restored == msgs
    assert store.history("s") == msgs
    assert store.events("s")[-1].kind == "restore"
    assert store.history("s", f"after:{cid}") == after  # still reachable


def test_append_extends_the_tip(store: SessionStore) -> None:
    ids = store.append_messages("s", [{"role": "user", "content": "a"}])
    ids += store.append_messages("s", [{"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}])
    assert store.history_ids("s") == ids
    assert [m["content"] for m in store.history("s")] == ["a", "b", "c"]


def test_bad_points_and_unknown_ids(store: SessionStore) -> None:
    store.record_messages("s", _conversation(1))
    with pytest.raises(NotFoundError):
        store.history("nope")
    with pytest.raises(NotFoundError):
        store.history("s", "before:c0000")
    with pytest.raises(NotFoundError):
        store.history("s", "event:99")
    with pytest.raises(InputError, match="unknown point"):
        store.history("s", "yesterday")
    with pytest.raises(NotFoundError):
        store.get_node("n-missing")
    with pytest.raises(NotFoundError):
        store.get_messages(["0" * 32])
    with pytest.raises(InputError):
        store.record_messages("s", [{"role": "user", "content": object()}])
    with pytest.raises(InputError):
        store.record_messages("", [])


def test_search_scopes_and_modes(store: SessionStore) -> None:
    store.record_messages("a", _conversation(2, tag=" alpha"))
    store.record_messages("b", _conversation(2, tag=" beta"))
    hits = store.search("ValueError: bad value 1")
    assert hits and all("ValueError: bad value 1" in h.snippet for h in hits)
    assert {s for h in hits for s in h.session_ids} == {"a", "b"}
    only_a = store.search("valueerror: BAD value 1", session_id="a")  # case-insensitive
    assert only_a and all(h.session_ids == ["a"] for h in only_a)
    assert store.search("turn 1 beta", session_id="a") == []
    assert [h.role for h in store.search("turn 1 beta")] == ["user"]
    # paths, URLs, tool names and a mid-word fragment
    assert store.search("src/pkg/mod1.py", session_id="a")
    assert store.search("https://example.com/docs/0")
    assert store.search("read_file", session_id="b")
    assert store.search("lueErr")
    # reasoning text is searchable too
    assert store.search("thinking 1", session_id="a")
    rx = store.search(r"bad value \d", mode="regex", session_id="a", limit=50)
    assert len(rx) == 2
    with pytest.raises(InputError, match="regular expression"):
        store.search("(", mode="regex")
    assert len(store.search("turn", limit=3)) == 3


def test_search_finds_short_cjk_words(store: SessionStore) -> None:
    store.record_messages("zh", [{"role": "user", "content": "请检查数据库连接配置是否正确"}, {"role": "assistant", "content": "好的"}])
    for scope in (None, "zh"):
        hits = store.search("数据库", session_id=scope)
        assert [h.role for h in hits] == ["user"]
        assert "数据库" in hits[0].snippet


def test_snippets_keep_the_match_whole(store: SessionStore) -> None:
    long_line = "x" * 2000 + " NEEDLE in a haystack " + "y" * 2000
    store.record_messages("s", [{"role": "tool_like", "content": "a"}] if False else [{"role": "user", "content": long_line}])
    hit = store.search("NEEDLE in a haystack", session_id="s")[0]
    assert "NEEDLE in a haystack" in hit.snippet
    assert hit.snippet.startswith("…") and hit.snippet.endswith("…")
    assert len(hit.snippet) < 1000


def test_nodes_form_a_dag_down_to_the_originals(store: SessionStore) -> None:
    msgs = _conversation(3)
    ids = store.record_messages("s", msgs)
    assert store.add_node("s", "n1", depth=0, text="[ctxengine:lcm node=n1] turns 0", children=[("message", i) for i in ids[1:5]])
    assert store.add_node("s", "n2", depth=0, text="[ctxengine:lcm node=n2] turns 1", children=[("message", i) for i in ids[5:9]])
    assert store.add_node("s", "top", depth=1, text="[ctxengine:lcm node=top] both", children=[("node", "n1"), ("node", "n2")], meta={"k": 1})
    assert not store.add_node("s", "n1", depth=0, text="other", children=[("message", ids[1])])
    top = store.get_node("top")
    assert (top.depth, top.children, top.meta) == (1, [("node", "n1"), ("node", "n2")], {"k": 1})
    assert store.get_node("n1").parents == ["top"]
    assert store.node_messages("top") == list(zip(ids[1:9], msgs[1:9], strict=True))
    hit = store.search("ValueError: bad value 0", session_id="s")
    assert hit[0].node_ids == ["n1"]
    node_hits = [h for h in store.search("both", session_id="s") if h.kind == "node"]
    assert [h.id for h in node_hits] == ["top"]
    assert [h.id for h in store.search("turns 1") if h.kind == "node"] == ["n2"]
    with pytest.raises(NotFoundError):
        store.add_node("s", "bad", depth=0, text="t", children=[("message", "f" * 32)])


def test_export_import_round_trip_is_exact(store: SessionStore, store_factory: Any) -> None:
    msgs = _conversation(3)
    ids = store.record_messages("s", msgs, meta={"agent": "test"})
    after = [msgs[0], {"role": "user", "content": "[ctxengine:lcm node=n1] s"}, *msgs[9:]]
    store.add_node("s", "n1", depth=0, text=after[1]["content"], children=[("message", i) for i in ids[1:9]])
    cid = store.record_compaction("s", {"engine": "lcm", "replaced": list(range(1, 9))}, msgs, after)
    store.record_messages("s", [*after, {"role": "user", "content": "q"}])
    doc = store.export_session("s")
    assert doc["format"] == EXPORT_FORMAT
    text = json.dumps(doc)  # JSON-ready
    copy_id = store.import_session(json.loads(text), session_id="s-copy")
    assert copy_id == "s-copy"
    for point in ("latest", "event:1", "event:2"):
        assert store.history("s-copy", point) == store.history("s", point)
    new_cid = store.compactions("s-copy")[0].id
    assert store.history("s-copy", f"before:{new_cid}") == store.history("s", f"before:{cid}")
    assert store.originals("s-copy") == store.originals("s")
    assert store.get_session("s-copy").meta == {"agent": "test"}
    with pytest.raises(StoreError, match="already exists"):
        store.import_session(doc)
    tampered = json.loads(text)
    tampered["messages"][1]["message"]["content"] = "changed"
    with pytest.raises(InputError, match="corrupt"):
        store.import_session(tampered, session_id="x")


def test_export_moves_between_backends(store: SessionStore) -> None:
    from ctxengine.store import SqliteStore

    msgs = _conversation(2)
    store.record_messages("s", msgs)
    after = [msgs[0], {"role": "user", "content": "[ctxengine:lcm node=q] s"}]
    cid = store.record_compaction("s", {"engine": "lcm"}, msgs, after)
    other = SqliteStore(":memory:")
    other.import_session(store.export_session("s"))
    assert other.history("s", f"before:{cid}") == msgs
    assert other.history("s", f"after:{cid}") == after
    assert other.export_session("s")["messages"] == store.export_session("s")["messages"]
    other.close()


def test_threads_share_one_store(store: SessionStore) -> None:
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(25):
                store.append_messages("shared", [{"role": "user", "content": f"t{t} m{i}"}])
                store.record_messages(f"own-{t}", [{"role": "user", "content": f"t{t} m{j}"} for j in range(i + 1)])
        except BaseException as exc:  # collected and re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    contents = [m["content"] for m in store.history("shared")]
    assert len(contents) == len(set(contents)) == 150
    for t in range(6):
        assert [c for c in contents if c.startswith(f"t{t} ")] == [f"t{t} m{i}" for i in range(25)]
        assert store.get_session(f"own-{t}").length == 25


def test_reopening_keeps_everything(store_factory: Any) -> None:
    s = store_factory()
    s.record_messages("s", _conversation(1))
    s.close()
    with pytest.raises(StoreError, match="closed"):
        s.history("s")
    again = store_factory()
    assert again.history("s") == _conversation(1)
    assert again.schema_version() == latest_version()


def test_message_ids_are_the_ids_recording_gives_and_write_nothing(store: SessionStore) -> None:
    msgs = _conversation(2)
    ids = store.message_ids(msgs)
    assert store.list_sessions() == []  # nothing written
    assert store.record_messages("s", msgs) == ids


def test_add_nodes_stores_the_compacted_context_and_its_nodes_in_one_go_without_moving_the_tip(store: SessionStore) -> None:
    msgs = _conversation(3)
    store.record_messages("s", msgs)
    events = len(store.events("s"))
    compacted = [msgs[0], {"role": "user", "content": "[digest] turns 0-1"}, *msgs[9:]]
    ids = store.message_ids(compacted)
    nodes = [
        NodeSpec("d1", 0, "[digest] turns 0-1", [("message", ids[1])], {"summarizer": "digest"}),
        NodeSpec("c1", 0, "[cut] last output", [("message", ids[-1])]),
    ]
    assert store.add_nodes("s", nodes, messages=compacted) == [True, True]
    assert store.add_nodes("s", nodes[:1], messages=compacted) == [False]  # left unchanged
    assert store.node_messages("d1") == [(ids[1], compacted[1])]
    assert store.get_node("c1").children == [("message", ids[-1])]
    assert store.history("s") == msgs and len(store.events("s")) == events  # the tip did not move
    with pytest.raises(InputError, match="at least one child"):
        store.add_nodes("s", [NodeSpec("empty", 0, "t", [])])
    with pytest.raises(NotFoundError, match="not in the store"):
        store.add_nodes("s", [NodeSpec("lost", 0, "t", [("message", "f" * 32)])])
    with pytest.raises(NotFoundError):
        store.get_node("lost")  # the failed batch wrote nothing


def test_a_compaction_records_its_engines_nodes_in_the_same_transaction(store: SessionStore) -> None:
    msgs = _conversation(3)
    store.record_messages("s", msgs)
    after = [msgs[0], {"role": "user", "content": "[digest] turns 0-2"}]
    before_ids = store.message_ids(msgs)
    node = NodeSpec("d1", 0, after[1]["content"], [("message", i) for i in before_ids[1:]])
    cid = store.record_compaction("s", {"engine": "t", "replaced": list(range(1, len(msgs)))}, msgs, after, nodes=[node])
    assert store.compactions("s")[0].id == cid
    assert [m for _, m in store.node_messages("d1")] == msgs[1:]
    assert store.history("s") == after
    # the engine's copy differs from what the host records (a client's cache marker): stored too
    later = [*after, {"role": "assistant", "content": "ok"}]
    store.record_messages("s", later)
    marked = [*later[:2], {**later[2], "cache_control": {"type": "ephemeral"}}]
    marked_ids = store.message_ids(marked)
    node2 = NodeSpec("d2", 0, "[digest] all", [("message", marked_ids[2])])
    store.record_compaction("s", {"engine": "t"}, later, later[:2], nodes=[node2], node_messages=marked)
    assert store.node_messages("d2") == [(marked_ids[2], marked[2])]
    assert store.history("s") == later[:2]
