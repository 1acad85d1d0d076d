"""Appending after a known message: the per-turn write path that records only what is new."""

from __future__ import annotations

import pytest

from ctxengine.errors import NotFoundError
from ctxengine.store import SessionStore
from ctxengine.store.base import blob_hash, canonical_json, message_id


def test_append_after_a_known_message_records_only_the_new_ones(store: SessionStore) -> None:
    ids = store.record_messages("s", [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])
    new = store.append_messages("s", [{"role": "user", "content": "c"}], after=ids[-1])
    assert store.history_ids("s") == [*ids, *new]
    assert [m["content"] for m in store.history("s")] == ["a", "b", "c"]
    # the id is the same content address a full recording gives
    assert new == [message_id(ids[-1], blob_hash(canonical_json({"role": "user", "content": "c"})))]
    assert store.record_messages("t", [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}])[-1] == new[0]
    assert store.events("s")[-1].kind == "append"


def test_append_after_an_earlier_message_branches(store: SessionStore) -> None:
    ids = store.record_messages("s", [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])
    other = store.append_messages("s", [{"role": "assistant", "content": "b2"}], after=ids[0])
    assert [m["content"] for m in store.history("s")] == ["a", "b2"]
    assert store.history_ids("s") == [ids[0], *other]
    assert [m["content"] for m in store.history("s", f"message:{ids[1]}")] == ["a", "b"]  # the old branch stays


def test_append_after_an_unknown_message_is_an_error(store: SessionStore) -> None:
    store.record_messages("s", [{"role": "user", "content": "a"}])
    with pytest.raises(NotFoundError, match="no such message"):
        store.append_messages("s", [{"role": "user", "content": "b"}], after="f" * 32)
    assert [m["content"] for m in store.history("s")] == ["a"]


def test_messages_written_since_the_last_search_are_found(store: SessionStore) -> None:
    ids = store.record_messages("s", [{"role": "user", "content": "first needle-one"}])
    assert [h.snippet for h in store.search("needle-one")] == ["first needle-one"]
    store.append_messages("s", [{"role": "assistant", "content": "second needle-two"}], after=ids[-1])
    store.record_messages("t", [{"role": "user", "content": "third needle-two"}])
    assert sorted(h.snippet for h in store.search("needle-two")) == ["second needle-two", "third needle-two"]


def test_a_history_recorded_again_keeps_its_ids_and_a_new_dict_is_hashed_anew(store: SessionStore) -> None:
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    first = store.record_messages("m", msgs)
    # the same objects again (a full record after a compaction): same chain, same ids
    assert store.record_messages("m", msgs) == first
    # a new dict with other content is a new message, whatever object it replaces
    edited = [*msgs[:2], {"role": "assistant", "content": "hello"}]
    again = store.record_messages("m", edited)
    assert again[:2] == first[:2] and again[2] != first[2]
    assert again[2] == message_id(first[1], blob_hash(canonical_json(edited[2])))


def _chain_ids(msgs: list[dict[str, str]]) -> list[str]:
    ids: list[str] = []
    for m in msgs:
        ids.append(message_id(ids[-1] if ids else None, blob_hash(canonical_json(m))))
    return ids


def test_a_history_recorded_again_after_a_compaction_gets_the_ids_of_a_fresh_recording(store: SessionStore) -> None:
    before = [{"role": "user", "content": f"u{i}"} if i % 2 == 0 else {"role": "assistant", "content": f"a{i}"} for i in range(6)]
    store.record_messages("s", before)
    after = [before[0], {"role": "assistant", "content": "summary"}, *before[4:]]
    store.record_compaction("s", {"engine": "x", "replaced": [1, 2, 3]}, before, after)
    turn = [*after, {"role": "user", "content": "next"}]
    ids = store.record_messages("s", turn)  # the prefix is the compaction's output, already stored
    assert ids == _chain_ids(turn)
    assert store.history_ids("s") == ids and store.history("s") == turn
    more = store.append_messages("s", [{"role": "assistant", "content": "done"}], after=ids[-1])
    assert store.history_ids("s") == [*ids, *more] == _chain_ids([*turn, {"role": "assistant", "content": "done"}])


def test_another_writer_moving_the_tip_is_respected(store_factory: object) -> None:
    one, two = store_factory(), store_factory()  # type: ignore[operator]
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    ids = one.record_messages("s", msgs)
    two.append_messages("s", [{"role": "user", "content": "from elsewhere"}], after=ids[-1])
    again = [*msgs, {"role": "user", "content": "c"}]
    assert one.record_messages("s", again) == _chain_ids(again)
    assert [m["content"] for m in two.history("s")] == ["a", "b", "c"]
    # the other branch is kept, and the session holds the messages of both
    assert [m["content"] for m in one.originals("s")][-1] == "c"
    new = one.append_messages("s", [{"role": "assistant", "content": "d"}], after=_chain_ids(again)[-1])
    assert [m["content"] for m in two.history("s")] == ["a", "b", "c", "d"]
    assert new == _chain_ids([*again, {"role": "assistant", "content": "d"}])[-1:]


def test_an_append_mixing_stored_and_new_contents_stores_each_content_once(store: SessionStore) -> None:
    first = [{"role": "user", "content": "same words"}, {"role": "assistant", "content": "other"}]
    ids = store.record_messages("s", first)
    batch = [
        {"role": "user", "content": "same words"},  # content already stored (another message id)
        {"role": "assistant", "content": "fresh words"},
        {"role": "user", "content": "same words"},  # twice in the batch
        {"role": "assistant", "content": "other"},
    ]
    new = store.append_messages("s", batch, after=ids[-1])
    assert new == _chain_ids([*first, *batch])[2:]
    assert store.history("s") == [*first, *batch] and store.history_ids("s") == [*ids, *new]
    # one stored content carries the three messages; the new one is its own content
    hits = store.search("same words")
    assert len(hits) == 1 and sorted(hits[0].message_ids) == sorted([ids[0], new[0], new[2]])
    assert [h.message_ids for h in store.search("fresh words")] == [[new[1]]]
    # and the next append after the mixed batch chains on keys read back correctly
    more = store.append_messages("s", [{"role": "user", "content": "fresh words"}, {"role": "assistant", "content": "last"}], after=new[-1])
    assert store.history_ids("s") == [*ids, *new, *more]
    assert [m["content"] for m in store.history("s")][-2:] == ["fresh words", "last"]
    assert store.history("s", f"message:{new[1]}") == [*first, *batch[:2]]


def test_an_append_of_messages_another_session_stored_after_the_same_parent_reuses_them(store: SessionStore) -> None:
    base = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    shared = [{"role": "user", "content": "shared turn"}, {"role": "assistant", "content": "shared answer"}]
    other = store.record_messages("t", [*base, *shared])
    ids = store.record_messages("s", base)
    # the first appended message is stored already (same parent, same content): so is its id
    new = store.append_messages("s", [*shared, {"role": "user", "content": "own turn"}], after=ids[-1])
    assert new == [*other[2:], *_chain_ids([*base, *shared, {"role": "user", "content": "own turn"}])[-1:]]
    assert store.history_ids("s") == [*ids, *new] and store.history_ids("t") == other
    assert [h.message_ids for h in store.search("shared answer")] == [[other[3]]]
    assert sorted(store.search("shared turn")[0].session_ids) == ["s", "t"]


def test_an_append_starting_with_new_content_then_stored_content_chains_on_the_stored_blob(store: SessionStore) -> None:
    ids = store.record_messages("s", [{"role": "user", "content": "old words"}])
    batch = [{"role": "assistant", "content": "brand new"}, {"role": "user", "content": "old words"}, {"role": "assistant", "content": "brand new"}]
    new = store.append_messages("s", batch, after=ids[-1])
    assert new == _chain_ids([{"role": "user", "content": "old words"}, *batch])[1:]
    assert store.history("s") == [{"role": "user", "content": "old words"}, *batch]
    assert sorted(store.search("old words")[0].message_ids) == sorted([ids[0], new[1]])
    assert sorted(store.search("brand new")[0].message_ids) == sorted([new[0], new[2]])
