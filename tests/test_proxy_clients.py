"""What real clients do that the proxy must take in its stride: switching models in a session,
relayed headers the server sets itself, paths of another API, recall calls next to the client's
own calls in one reply. Real proxy (uvicorn on 127.0.0.1), real stub upstream, real SQLite."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx
import openai
import pytest
from tests.test_proxy import ANTHROPIC_TOOLS, KEY, TOOLS, make_config, metric

from ctxengine.messages import validate
from ctxengine.proxy import SESSION_HEADER, ProxyServer
from ctxengine.proxy.apis import OPENAI
from ctxengine.testing.stub_server import StubReply, StubServer


@pytest.fixture
def stub() -> Iterator[StubServer]:
    with StubServer() as s:
        yield s


def _agent_turns(c: openai.OpenAI, msgs: list[Any], turns: int, model: str, start: int = 0) -> None:
    for turn in range(start, start + turns):
        call = {"id": f"call_{turn}", "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"path": f"log{turn}.txt"})}}
        output = f"turn {turn}: " + ("log line with details about the build\n" * 30)
        msgs += [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": f"call_{turn}", "content": output}]
        r = c.chat.completions.create(model=model, messages=msgs, tools=TOOLS)  # type: ignore[arg-type]
        msgs += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": f"continue {turn}"}]


def test_switching_model_mid_conversation_continues_the_working_context(stub: StubServer, tmp_path: Path) -> None:
    # the summarizing path: its compactions come at known points (digests fold more often)
    cfg = make_config(stub, tmp_path, context={"engine": "compressor"}, compression={"mode": "summary"}, model={"context_length": 6000})
    stub.responder = lambda req: StubReply.ok("ack " + "z" * 40)
    with ProxyServer(cfg) as p:
        c = openai.OpenAI(base_url=p.openai_base_url, api_key=KEY, max_retries=0, default_headers={SESSION_HEADER: "switch"})
        msgs: list[Any] = [{"role": "system", "content": "You are a careful agent."}, {"role": "user", "content": "fix the failing build"}]
        _agent_turns(c, msgs, 24, "gpt-4o")
        compactions = metric(p, "ctxengine_proxy_compactions_total", api="openai")
        assert compactions >= 1
        before = stub.requests[-1].body["messages"]
        msgs.append({"role": "user", "content": "now with the other model"})
        c.chat.completions.create(model="gpt-4o-mini", messages=msgs, tools=TOOLS)  # type: ignore[arg-type]
        after = stub.requests[-1].body["messages"]
        # the new model's manager resumed the recorded working context: nothing compacted anew
        assert metric(p, "ctxengine_proxy_compactions_total", api="openai") == compactions
        assert after[: len(before)] == before and after[len(before) :] == msgs[-3:]
        assert "switch" not in p.proxy.manager(OPENAI, "gpt-4o").sessions
        assert "switch" in p.proxy.manager(OPENAI, "gpt-4o-mini").sessions


def test_relayed_responses_carry_date_and_server_once(stub: StubServer, tmp_path: Path) -> None:
    stub.script(StubReply.ok("hi"), StubReply.ok("hi"))
    with ProxyServer(make_config(stub, tmp_path)) as p:
        body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}
        for stream in (False, True):
            r = httpx.post(p.openai_base_url + "/chat/completions", json={**body, "stream": stream}, headers={"authorization": f"Bearer {KEY}"})
            assert r.status_code == 200
            assert len(r.headers.get_list("date")) == 1 and len(r.headers.get_list("server")) <= 1
        r = httpx.get(p.openai_base_url + "/models", headers={"authorization": f"Bearer {KEY}"})
        assert len(r.headers.get_list("date")) == 1 and len(r.headers.get_list("server")) <= 1


def test_a_path_of_another_api_gets_a_json_404(stub: StubServer, tmp_path: Path) -> None:
    with ProxyServer(make_config(stub, tmp_path)) as p:
        r = httpx.post(p.url + "/api/chat", json={"model": "llama3", "messages": []})  # Ollama's own API
        assert r.status_code == 404
        error = r.json()["error"]
        assert error["status"] == "NOT_FOUND" and "/v1/chat/completions" in error["message"] and "/v1/messages" in error["message"]
        assert "/v1beta/models/" in error["message"]
        assert stub.calls == 0


@pytest.mark.parametrize("stream", [False, True])
def test_a_recall_call_beside_a_client_call_is_answered_and_put_back(stub: StubServer, tmp_path: Path, stream: bool) -> None:
    cfg = make_config(stub, tmp_path, context={"engine": "compressor"}, model={"context_length": 6000})
    secret = "\nERROR: checksum mismatch in artifact 9f3c2e1\n"

    def responder(req: Any) -> StubReply:
        last = req.body["messages"][-1]
        if "which sha" in str(last.get("content")):
            return StubReply.calling(("ctx_grep", {"query": "9f3c2e1"}), ("read_file", {"path": "build.log"}))
        return StubReply.ok("ack " + "z" * 40)

    stub.responder = responder
    with ProxyServer(cfg) as p:
        c = openai.OpenAI(base_url=p.openai_base_url, api_key=KEY, max_retries=0, default_headers={SESSION_HEADER: f"mixed-{stream}"})
        msgs: list[Any] = [{"role": "system", "content": "You are a careful agent."}, {"role": "user", "content": "fix the failing build"}]
        for turn in range(30):
            output = f"turn {turn}: " + ("log line with details about the build\n" * 30) + (secret if turn == 1 else "")
            call = {"id": f"call_{turn}", "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"path": f"log{turn}.txt"})}}
            msgs += [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": f"call_{turn}", "content": output}]
            r = c.chat.completions.create(model="gpt-4o", messages=msgs, tools=TOOLS)  # type: ignore[arg-type]
            msgs += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": f"continue {turn}"}]
        assert "ctx_grep" in [t["function"]["name"] for t in stub.requests[-1].body["tools"]]
        msgs.append({"role": "user", "content": "which sha failed earlier?"})
        n = len(stub.requests)
        if stream:
            chunks = list(c.chat.completions.create(model="gpt-4o", messages=msgs, tools=TOOLS, stream=True))  # type: ignore[arg-type]
            names = [tc.function.name for ch in chunks if ch.choices for tc in ch.choices[0].delta.tool_calls or [] if tc.function and tc.function.name]
            ids = [tc.id for ch in chunks if ch.choices for tc in ch.choices[0].delta.tool_calls or [] if tc.id]
        else:
            r = c.chat.completions.create(model="gpt-4o", messages=msgs, tools=TOOLS)  # type: ignore[arg-type]
            names = [tc.function.name for tc in r.choices[0].message.tool_calls or []]  # type: ignore[union-attr]
            ids = [tc.id for tc in r.choices[0].message.tool_calls or []]
        assert names == ["read_file"] and len(stub.requests) == n + 1  # the client gets its own call only
        # the client answers its call; the next request carries the recall turn too, valid
        msgs += [{"role": "assistant", "content": None, "tool_calls": [{"id": ids[0], "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]}]
        msgs += [{"role": "tool", "tool_call_id": ids[0], "content": "build.log: ok"}]
        for _ in range(2):  # and every request after it
            c.chat.completions.create(model="gpt-4o", messages=msgs, tools=TOOLS)  # type: ignore[arg-type]
            sent = stub.requests[-1].body["messages"]
            assert validate(sent) == []
            turn = next(m for m in sent if m.get("role") == "assistant" and any(tc["id"] == ids[0] for tc in m.get("tool_calls") or []))
            grep_ids = [tc["id"] for tc in turn["tool_calls"] if tc["function"]["name"] == "ctx_grep"]
            assert len(grep_ids) == 1
            answer = next(m for m in sent if m.get("tool_call_id") == grep_ids[0])
            assert "9f3c2e1" in answer["content"]
            msgs += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "go on"}]


def test_count_tokens_counts_what_the_proxy_sends(stub: StubServer, tmp_path: Path) -> None:
    cfg = make_config(stub, tmp_path, context={"engine": "compressor"}, model={"context_length": 6000})
    stub.responder = lambda req: StubReply.ok("ack " + "z" * 40)
    with ProxyServer(cfg) as p:
        c = anthropic.Anthropic(base_url=p.anthropic_base_url, api_key=KEY, max_retries=0)
        msgs: list[Any] = [{"role": "user", "content": "fix the failing build"}]
        for turn in range(40):
            use = {"type": "tool_use", "id": f"tu_{turn}", "name": "read_file", "input": {"path": f"log{turn}.txt"}}
            result = {"type": "tool_result", "tool_use_id": f"tu_{turn}", "content": f"turn {turn}: " + "log line with details about the build\n" * 30}
            msgs += [{"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]
            r = c.messages.create(model="claude-sonnet-4-5", max_tokens=64, system="You are a careful agent.", messages=msgs, tools=ANTHROPIC_TOOLS)  # type: ignore[arg-type]
            msgs += [{"role": "assistant", "content": r.content[0].text}, {"role": "user", "content": f"continue {turn}"}]  # type: ignore[union-attr]
        sent = stub.requests[-1].body
        full = {"model": "claude-sonnet-4-5", "system": "You are a careful agent.", "messages": msgs, "tools": ANTHROPIC_TOOLS}
        assert c.messages.count_tokens(**full).input_tokens >= 1  # type: ignore[arg-type]
        # the upstream was asked to count the working context as sent, plus what is new since
        asked = stub.counted[-1].body
        assert asked["messages"] == [*sent["messages"], *msgs[-2:]] and asked.get("system") == sent.get("system")
        assert len(json.dumps(asked)) < 0.6 * len(json.dumps(full))
        # a body that continues no session is counted as it came
        other = {"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "a new conversation"}]}
        c.messages.count_tokens(**other)  # type: ignore[arg-type]
        assert stub.counted[-1].body == other


@pytest.mark.parametrize("stream", [False, True])
def test_a_context_length_rejection_is_learnt_compacted_and_retried_unseen(stub: StubServer, tmp_path: Path, stream: bool) -> None:
    """An unknown model with a 16K window the proxy does not know: the first request over it is
    rejected as OpenAI does; the proxy learns the window, compacts, sends again; the client
    never sees the 400, and the next requests are not rejected."""
    limit = 16384
    rejected: list[int] = []

    def responder(req: Any) -> StubReply:
        tokens = len(req.prompt_text) // 4
        if tokens > limit:
            rejected.append(tokens)
            return StubReply.fail(400, f"This model's maximum context length is {limit} tokens. However, your messages resulted in {tokens} tokens.", retry_after_ms=None)
        return StubReply.ok("ack")

    stub.responder = responder
    # the summarizing path lets the context reach the upstream's window (digests stay under it)
    cfg = make_config(stub, tmp_path, context={"engine": "compressor"}, compression={"mode": "summary"})
    with ProxyServer(cfg) as p:
        c = openai.OpenAI(base_url=p.openai_base_url, api_key=KEY, max_retries=0, default_headers={SESSION_HEADER: f"local-{stream}"})
        msgs: list[Any] = [{"role": "system", "content": "You are a careful agent."}, {"role": "user", "content": "fix the failing build"}]
        for turn in range(14):  # ~2.2K tokens each (of the stub's count): past 16K by the 8th
            call = {"id": f"call_{turn}", "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"path": f"log{turn}.txt"})}}
            output = f"turn {turn}: " + "".join(f"log line {i} of turn {turn} with details about the build\n" for i in range(150))
            msgs += [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": call["id"], "content": output}]
            if stream:
                text = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(model="local-coder", messages=msgs, tools=TOOLS, stream=True) if ch.choices)  # type: ignore[arg-type]
            else:
                text = c.chat.completions.create(model="local-coder", messages=msgs, tools=TOOLS).choices[0].message.content or ""  # type: ignore[arg-type]
            assert text == "ack"
            msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": f"continue {turn}"}]
        assert len(rejected) == 1  # learnt once, never again
        assert p.proxy.windows.learnt("openai", "local-coder") == limit
        assert metric(p, "ctxengine_proxy_context_retries_total", api="openai") == 1
        assert all(len(r.prompt_text) // 4 <= limit for r in stub.requests[-5:])
        assert p.proxy.manager(OPENAI, "local-coder").status(f"local-{stream}")["window_source"] == "learnt"


def test_two_chats_with_the_same_opening_are_two_sessions_and_a_client_id_wins(stub: StubServer, tmp_path: Path) -> None:
    """aider's opening (system prompt and example exchange) is the same in every chat, and it
    sends no id: two chats interleaved are still two sessions. Claude Code's id names its own."""
    stub.responder = lambda req: StubReply.ok("ok")
    opening = [
        {"role": "system", "content": "Act as an expert software developer."},
        {"role": "user", "content": "Change get_factorial() to use math.factorial"},
        {"role": "assistant", "content": "To make this change we need to modify `mathweb/flask/app.py`."},
    ]
    with ProxyServer(make_config(stub, tmp_path)) as p:
        c = openai.OpenAI(base_url=p.openai_base_url, api_key=KEY, max_retries=0)
        chats: dict[str, list[Any]] = {"a": [*opening], "b": [*opening]}
        names: dict[str, set[str]] = {"a": set(), "b": set()}
        for turn in range(4):
            for name, msgs in chats.items():
                msgs.append({"role": "user", "content": f"chat {name}, request {turn}"})
                raw = c.chat.completions.with_raw_response.create(model="gpt-4o", messages=msgs)
                names[name].add(raw.headers[SESSION_HEADER])
                msgs.append({"role": "assistant", "content": raw.parse().choices[0].message.content})
        assert len(names["a"]) == 1 and len(names["b"]) == 1 and names["a"] != names["b"]
        uid = json.dumps({"device_id": "d" * 64, "account_uuid": "", "session_id": "0b3f6a1e-1c2d-4e5f-8a9b-0c1d2e3f4a5b"})
        a = anthropic.Anthropic(base_url=p.anthropic_base_url, api_key=KEY, max_retries=0)
        raw2 = a.messages.with_raw_response.create(model="claude-sonnet-4-5", max_tokens=8, messages=[{"role": "user", "content": "hi"}], metadata={"user_id": uid})
        assert raw2.headers[SESSION_HEADER] == "cc:0b3f6a1e-1c2d-4e5f-8a9b-0c1d2e3f4a5b"


def test_after_a_restart_a_derived_key_resumes_its_own_conversation_only(stub: StubServer, tmp_path: Path) -> None:
    stub.responder = lambda req: StubReply.ok("ok")
    opening = [{"role": "system", "content": "Act as an expert software developer."}, {"role": "user", "content": "Change get_factorial() to use math.factorial"}]
    chats: dict[str, list[Any]] = {"a": [*opening], "b": [*opening]}
    seen: dict[str, list[str]] = {"a": [], "b": []}

    def turn(p: ProxyServer, name: str) -> None:
        c = openai.OpenAI(base_url=p.openai_base_url, api_key=KEY, max_retries=0)
        chats[name].append({"role": "user", "content": f"chat {name}, request {len(chats[name])}"})
        raw = c.chat.completions.with_raw_response.create(model="gpt-4o", messages=chats[name])
        seen[name].append(raw.headers[SESSION_HEADER])
        chats[name].append({"role": "assistant", "content": raw.parse().choices[0].message.content})

    with ProxyServer(make_config(stub, tmp_path)) as p:
        for _ in range(3):
            turn(p, "a")
            turn(p, "b")
    with ProxyServer(make_config(stub, tmp_path)) as p:  # the same store, an empty router
        turn(p, "b")  # the other conversation comes first: it must not take the key's session
        turn(p, "a")
        sessions = p.proxy.manager(OPENAI, "gpt-4o").sessions
    assert len(set(seen["a"])) == 1  # before and after the restart
    # the key's other conversation (<key>.…) is read back from the store too and resumed
    assert len(set(seen["b"])) == 1
    assert seen["b"][-1] != seen["a"][0] and seen["b"][0] != seen["a"][0]
    assert seen["a"][-1] in sessions and seen["b"][-1] in sessions


def test_opencode_and_qwen_code_sessions_are_named_by_their_own_ids(stub: StubServer, tmp_path: Path) -> None:
    """opencode sends ``x-session-id: ses_…`` (Anthropic and OpenAI providers alike), Qwen Code's
    DashScope provider ``metadata.sessionId``: two chats with the same opening are two sessions,
    each named by the client's id, and a chat's turns stay in it."""
    opening = [{"role": "system", "content": "You are opencode."}, {"role": "user", "content": "hi"}]
    seen: list[str] = []
    with ProxyServer(make_config(stub, tmp_path)) as p:
        for turn in range(3):
            for ses in ("ses_aaa111", "ses_bbb222"):
                msgs = [*opening, *[m for k in range(turn) for m in ({"role": "assistant", "content": f"{ses} {k}"}, {"role": "user", "content": f"go {k}"})]]
                r = httpx.post(p.openai_base_url + "/chat/completions", json={"model": "gpt-4o", "messages": msgs}, headers={"authorization": f"Bearer {KEY}", "x-session-id": ses})
                assert r.status_code == 200
                seen.append(r.headers[SESSION_HEADER])
            body = {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
            r = httpx.post(p.anthropic_base_url + "/v1/messages", json=body, headers={"x-api-key": KEY, "x-session-id": "ses_ccc333"})
            seen.append(r.headers[SESSION_HEADER])
            body = {"model": "qwen3-coder-plus", "messages": opening, "metadata": {"sessionId": "6f0c-qwen", "promptId": f"p{turn}"}}
            r = httpx.post(p.openai_base_url + "/chat/completions", json=body, headers={"authorization": f"Bearer {KEY}"})
            seen.append(r.headers[SESSION_HEADER])
    assert sorted(set(seen)) == ["qwen:6f0c-qwen", "sid:ses_aaa111", "sid:ses_bbb222", "sid:ses_ccc333"]
