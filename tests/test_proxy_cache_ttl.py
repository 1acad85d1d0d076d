"""``prompt_caching.cache_ttl: auto`` through the proxy: each session's markers follow its pace
(5m while machine-paced, 1h once a person's pauses cost more), as the library marks them; a
fixed TTL stays fixed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from ctxengine.config import Config
from ctxengine.kernel import breakpoints
from ctxengine.proxy import SESSION_HEADER, ProxyServer
from ctxengine.testing.stub_server import StubReply, StubServer

SYSTEM = "Rule 17: never edit generated files; ask first. " * 800  # long enough to be cached


class Clock:
    """The monotonic clock the session's pace reads, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def stub() -> Iterator[StubServer]:
    with StubServer() as s:
        s.responder = lambda req: StubReply.ok("ack")
        yield s


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(breakpoints.time, "monotonic", c)
    return c


def config(stub: StubServer, tmp_path: Path, ttl: str) -> Config:
    return Config().with_overrides(
        proxy={"openai_base_url": stub.openai_base_url, "anthropic_base_url": stub.anthropic_base_url},
        store={"path": str(tmp_path / "sessions.db")},
        prompt_caching={"cache_ttl": ttl},
    )


def turn(p: ProxyServer, stub: StubServer, session: str, n: int) -> list[str]:
    """One request of ``n`` user turns; the TTLs of the markers the upstream received."""
    messages: list[dict[str, Any]] = []
    for k in range(n):
        messages += [{"role": "user", "content": f"step {k}"}, {"role": "assistant", "content": f"done {k}"}]
    messages.append({"role": "user", "content": f"step {n}"})
    r = httpx.post(
        p.anthropic_base_url + "/v1/messages",
        json={"model": "claude-opus-4-5", "max_tokens": 8, "system": SYSTEM, "messages": messages},
        headers={"x-api-key": "sk-k", "anthropic-version": "2023-06-01", SESSION_HEADER: session},
        timeout=30,
    )
    assert r.status_code == 200
    sent = json.dumps(stub.requests[-1].body)
    markers = sent.count('"cache_control"')
    assert markers >= 1
    return ["1h"] * sent.count('"ttl": "1h"') + ["5m"] * (markers - sent.count('"ttl": "1h"'))


def test_auto_ttl_follows_each_sessions_pace(stub: StubServer, tmp_path: Path, clock: Clock) -> None:
    with ProxyServer(config(stub, tmp_path, "auto")) as p:
        for k in range(4):  # machine-paced: seconds apart
            assert set(turn(p, stub, "agent", k)) == {"5m"}
            clock.now += 5
        person = []
        for k in range(4):  # a person pauses ten minutes between requests
            person += turn(p, stub, "person", k)
            clock.now += 600
        assert set(turn(p, stub, "person", 4)) == {"1h"}
        assert set(person[:1]) == {"5m"}  # the first request knows of no pause yet
        clock.now += 5
        assert set(turn(p, stub, "agent", 4)) == {"5m"}  # the machine-paced session keeps its TTL


def test_a_fixed_ttl_is_kept_whatever_the_pace(stub: StubServer, tmp_path: Path, clock: Clock) -> None:
    with ProxyServer(config(stub, tmp_path, "5m")) as p:
        for k in range(4):
            assert set(turn(p, stub, "person", k)) == {"5m"}
            clock.now += 600
