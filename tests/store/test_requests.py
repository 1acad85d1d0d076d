"""The request log (migration ``request_log``): rows per request, added up by group, on SQLite
and PostgreSQL."""

from __future__ import annotations

import pytest

from ctxengine.errors import InputError, NotFoundError
from ctxengine.store import RequestRecord, SessionStore


def _log(store: SessionStore) -> None:
    rows = [
        RequestRecord("a", "openai", "gpt-4o", created_at=1000.0, client="aider", tokens_in=900, tokens_out=500, prompt_tokens=520, cache_read_tokens=400, compactions=1),
        RequestRecord("a", "openai", "gpt-4o", created_at=1100.0, client="aider", tokens_in=1000, tokens_out=600, prompt_tokens=620, cache_read_tokens=500, outcome="fail_open"),
        RequestRecord("b", "anthropic", "claude-sonnet-4-5", created_at=4000.0, client="claude-cli", tokens_in=50, tokens_out=50, prompt_tokens=60, cache_write_tokens=60, completion_tokens=7),
        RequestRecord("b", "anthropic", "claude-sonnet-4-5", created_at=4100.0, client="claude-cli", outcome="upstream_error", status=529, shadow=True),
    ]
    for r in rows:
        store.record_request(r)


def test_a_sessions_requests_come_back_in_order(store: SessionStore) -> None:
    _log(store)
    got = store.requests("a")
    assert [(r.created_at, r.tokens_in, r.outcome, r.client) for r in got] == [(1000.0, 900, "ok", "aider"), (1100.0, 1000, "fail_open", "aider")]
    assert store.requests("b")[-1].shadow is True and store.requests("b")[-1].status == 529
    with pytest.raises(NotFoundError):
        store.requests("nope")


def test_usage_adds_up_by_model_client_session_and_time(store: SessionStore) -> None:
    _log(store)
    [total] = store.usage()
    assert (total.requests, total.tokens_in, total.tokens_out, total.cache_read_tokens, total.cache_write_tokens) == (4, 1950, 1150, 900, 60)
    assert (total.fail_opens, total.errors, total.shadow, total.compactions) == (1, 1, 1, 1)
    assert (total.first_at, total.last_at) == (1000.0, 4100.0)
    by_model = {r.key["model"]: r.requests for r in store.usage(["model"])}
    assert by_model == {"gpt-4o": 2, "claude-sonnet-4-5": 2}
    assert {r.key["session"]: r.tokens_in for r in store.usage(["session"])} == {"a": 1900, "b": 50}
    buckets = {r.key["bucket"]: r.requests for r in store.usage(["bucket"], bucket=3600.0)}
    assert buckets == {0.0: 2, 3600.0: 2}
    assert store.usage(["client"], since=2000.0)[0].key == {"client": "claude-cli"}
    assert store.usage(session_id="a")[0].requests == 2
    with pytest.raises(InputError, match="cannot group"):
        store.usage(["colour"])


def test_an_empty_log_adds_up_to_zero(store: SessionStore) -> None:
    [total] = store.usage()
    assert total.requests == 0 and total.key == {}
    assert store.usage(["model"]) == []


def test_a_reader_adds_up_only_what_was_logged_since(store: SessionStore) -> None:
    from ctxengine.ui.usage import UsageReader

    reader = UsageReader(store)
    _log(store)
    by = ["model", "client", "bucket"]

    def same() -> None:
        assert sorted(map(repr, reader.usage(by, bucket=60.0))) == sorted(map(repr, store.usage(by, bucket=60.0)))
        assert reader.usage()[0] == store.usage()[0]

    same()
    position = store.request_log_position()
    store.record_request(RequestRecord("c", "openai", "gpt-4o", created_at=1010.0, client="aider", tokens_in=7, tokens_out=5, prompt_tokens=5))
    store.record_request(RequestRecord("c", "openai", "o3", created_at=9000.0, client="codex", tokens_in=3, tokens_out=3))
    assert store.request_log_position() > position
    assert [r.requests for r in store.usage(after=position)] == [2]
    same()  # the rows since, added to the kept sums
    assert reader.usage(session_id="c")[0].requests == 2  # scoped reads go to the store
