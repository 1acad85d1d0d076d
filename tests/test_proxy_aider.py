"""aider through the proxy (issue 37, item 2): its default ``reminder: user`` appends the system
reminder to the newest user message and resends that message without it next turn. Each chat
stays one session, compacted incrementally; two chats at once are two sessions. Real proxy
(uvicorn on 127.0.0.1), real stub upstream, real SQLite; the client is scripted as aider sends
(``scripts/aider_session.py``)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from tests.test_proxy import KEY, make_config, metric

from ctxengine.messages import Message, content_text
from ctxengine.proxy import SESSION_HEADER, ProxyServer
from ctxengine.proxy.apis import OPENAI
from ctxengine.testing.stub_server import StubReply, StubServer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
try:
    from aider_session import REMINDER, aider_session, with_reminder
finally:
    sys.path.pop(0)

TURNS = 8
WINDOW = 16_000


@pytest.fixture
def stub() -> Iterator[StubServer]:
    with StubServer() as s:
        s.responder = lambda req: StubReply.ok("I will change the files as asked.")
        yield s


class AiderChat:
    """One aider chat: its scripted user turns, the history it keeps (without the reminder) and
    the session ids the proxy named for its requests."""

    def __init__(self, seed: int) -> None:
        script = aider_session(TURNS, seed=seed)
        self.history: list[Message] = script[:3]  # system prompt and the example exchange
        self.users = [m for m in script[3:] if m["role"] == "user"]
        self.sessions: list[str] = []
        self.last: list[Message] = []  # the latest request

    def turn(self, client: openai.OpenAI, k: int) -> list[Message]:
        self.history.append(self.users[k])
        request = with_reminder(self.history)
        raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=request)  # type: ignore[arg-type]
        self.sessions.append(raw.headers[SESSION_HEADER])
        self.last = request
        self.history.append({"role": "assistant", "content": raw.parse().choices[0].message.content})
        return request


def run(stub: StubServer, path: Path, seeds: list[int]) -> tuple[list[AiderChat], float]:
    chats = [AiderChat(seed) for seed in seeds]
    cfg = make_config(stub, path, model={"context_length": WINDOW})
    with ProxyServer(cfg) as p:
        client = openai.OpenAI(base_url=p.openai_base_url, api_key=KEY, max_retries=0)
        for k in range(TURNS):
            for chat in chats:  # interleaved
                chat.turn(client, k)
        compactions = metric(p, "ctxengine_proxy_compactions_total", api="openai")
        store = p.proxy.manager(OPENAI, "gpt-4o").store
        assert store is not None
        for chat in chats:  # the store's originals are what the client sent last, reminder and all
            sent = [content_text(m.get("content")) for m in chat.last]
            assert [content_text(m.get("content")) for m in store.originals(chat.sessions[-1])] == sent
            assert sent[-1].endswith(REMINDER) and not sent[-3].endswith(REMINDER)
        return chats, compactions


def test_two_aider_chats_with_the_reminder_are_two_sessions_compacted_incrementally(stub: StubServer, tmp_path: Path) -> None:
    alone = 0.0
    for seed in (1, 2):
        (chat,), compactions = run(stub, tmp_path / f"alone-{seed}", [seed])
        assert len(set(chat.sessions)) == 1, chat.sessions
        alone += compactions
    chats, together = run(stub, tmp_path / "together", [1, 2])
    assert [len(set(c.sessions)) for c in chats] == [1, 1]
    assert chats[0].sessions[0] != chats[1].sessions[0]
    assert 1 <= together <= alone  # compacted, and incrementally: no chat compacted from scratch again
    # what went upstream never brings back a reminder the client dropped
    for req in stub.requests:
        texts = [content_text(m.get("content")) for m in req.body["messages"]]
        assert sum(REMINDER in t for t in texts) <= 1 and REMINDER in texts[-1]
