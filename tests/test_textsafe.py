"""Text that cannot be encoded (lone surrogates): preserved in messages, escaped in JSON we
write, replaced in text we generate; never a UnicodeEncodeError out of ``prepare``, never a
session the store stops recording."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxengine import ContextManager
from ctxengine.config import Config
from ctxengine.store import SqliteStore
from ctxengine.textsafe import REPLACEMENT, clean, dumps, has_surrogates

surrogates = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
texts = st.lists(st.one_of(st.characters(), surrogates), max_size=40).map("".join)


@settings(max_examples=200)
@given(value=st.recursive(st.none() | st.integers() | texts, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3), max_leaves=10))
def test_dumps_is_encodable_and_round_trips_exactly(value: Any) -> None:
    text = dumps(value)
    text.encode("utf-8")
    # exactly what standard JSON carries: a lone surrogate survives; two separate code points
    # forming a high+low pair read back as the one character they encode (any JSON parser does)
    assert json.loads(text) == json.loads(json.dumps(value))


@given(text=texts)
def test_clean_is_encodable_and_only_touches_surrogates(text: str) -> None:
    out = clean(text)
    out.encode("utf-8")
    assert len(out) == len(text)
    assert all(a == b or (has_surrogates(a) and b == REPLACEMENT) for a, b in zip(text, out, strict=True))


def chat(extra: str) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "sys"}]
    for i in range(30):
        cid = f"c{i}"
        msgs += [
            {"role": "user", "content": f"step {i} {extra} " + "words " * 30},
            {"role": "assistant", "content": f"ok {extra}", "tool_calls": [{"id": cid, "type": "function", "function": {"name": "read", "arguments": json.dumps({"p": f"f{i} {extra}"})}}]},
            {"role": "tool", "tool_call_id": cid, "content": f"out {i} {extra}\n" * 20},
        ]
    msgs.append({"role": "user", "content": f"last {extra}"})
    return msgs


@pytest.mark.parametrize("engine", ["compressor", "rules", "lcm", "cacheaware"])
@pytest.mark.parametrize("counter", ["estimate", "exact"])
def test_prepare_with_lone_surrogates_compacts_and_records(tmp_path: Path, engine: str, counter: str) -> None:
    path = tmp_path / "s.db"
    cfg = Config.from_dict({"context": {"engine": engine, "token_counter": counter}, "store": {"path": str(path)}})
    ctx = ContextManager.from_config(cfg, model="gpt-4o", context_length=3_000)
    msgs = chat("\ud800 lone \udfff")
    out = ctx.prepare(msgs)
    assert out[-1] == msgs[-1]  # the caller's text comes back exactly
    assert ctx.status()["store_errors"] == 0
    dumps(out).encode("utf-8")
    with SqliteStore(path) as store:
        assert store.history("default")[-1] == msgs[-1]  # the latest turn was recorded, exactly
        assert msgs[1] in store.originals("default")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(extra=texts)
def test_any_text_is_recorded(tmp_path: Path, extra: str) -> None:
    cfg = Config.from_dict({"context": {"engine": "rules"}, "store": {"path": str(tmp_path / "h.db")}})
    ctx = ContextManager.from_config(cfg, model="gpt-4o", context_length=3_000, session_id=f"s{abs(hash(extra))}")
    ctx.prepare(chat(extra))
    assert ctx.status()["store_errors"] == 0
