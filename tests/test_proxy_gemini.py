"""The Gemini API through the proxy: the lossless conversion of ``contents`` (property-tested),
and a Gemini CLI-shaped agent (``streamGenerateContent?alt=sse``, the whole history resent,
function calls with thought signatures) against the stub upstream speaking Gemini, at a window
its files overflow."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxengine.config import Config
from ctxengine.engine import normalize_usage
from ctxengine.proxy import ProxyServer, gemini_convert
from ctxengine.proxy.gemini import GEMINI, key_to_header
from ctxengine.proxy.limits import context_limit_from_error, is_context_length_error
from ctxengine.testing import gemini_stub
from ctxengine.testing.strict_upstream.tokens import count_request_tokens
from ctxengine.testing.stub_server import RecordedRequest, StubReply, StubServer

KEY = "AIzaSy-secret-gemini-key-0123456789"
WINDOW = 16_000
MODEL = "gemini-2.5-flash"
TOOLS = [{"functionDeclarations": [{"name": "read_file", "description": "Read a file.", "parametersJsonSchema": {"type": "object", "properties": {"path": {"type": "string"}}}}]}]
SYSTEM = {"role": "user", "parts": [{"text": "You are an interactive CLI agent."}]}

# -- the conversion ---------------------------------------------------------------------------

_text = st.text(min_size=0, max_size=20)
_sig = st.text(alphabet="abcdefABCDEF0123456789+/=", min_size=4, max_size=12)


@st.composite
def _model_content(draw: st.DrawFn, calls: list[str]) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    if draw(st.booleans()):
        parts.append({"text": draw(_text), "thought": True})
    if draw(st.booleans()):
        part: dict[str, Any] = {"text": draw(_text)}
        if draw(st.booleans()):
            part["thoughtSignature"] = draw(_sig)
        parts.append(part)
    for k, name in enumerate(calls):
        fc: dict[str, Any] = {"name": name, "args": draw(st.dictionaries(st.sampled_from(["path", "n", "q"]), st.integers() | _text, max_size=2))}
        if draw(st.booleans()):
            fc["id"] = f"call-{draw(st.integers(0, 99))}-{k}"
        part = {"functionCall": fc}
        if k == 0 and draw(st.booleans()):
            part["thoughtSignature"] = draw(_sig)
        parts.append(part)
    return {"role": "model", "parts": parts or [{"text": ""}]}


@st.composite
def gemini_bodies(draw: st.DrawFn) -> dict[str, Any]:
    contents: list[dict[str, Any]] = [{"role": "user", "parts": [{"text": draw(_text)}]}]
    for _ in range(draw(st.integers(0, 4))):
        names = draw(st.lists(st.sampled_from(["read_file", "ls", "grep"]), max_size=3))
        model = draw(_model_content(names))
        contents.append(model)
        answers: list[dict[str, Any]] = []
        for p in model["parts"]:
            if "functionCall" in p:
                fr: dict[str, Any] = {"name": p["functionCall"]["name"], "response": draw(st.sampled_from([{"output": "x"}, {"error": "no"}, {"a": 1, "b": [2]}]))}
                if "id" in p["functionCall"]:
                    fr["id"] = p["functionCall"]["id"]
                answers.append({"functionResponse": fr})
        extra = draw(st.lists(st.sampled_from([{"text": "hi"}, {"inlineData": {"mimeType": "image/png", "data": "iVBORw0K"}}, {"fileData": {"fileUri": "gs://a", "mimeType": "text/plain"}}]), max_size=2))
        contents.append({"role": "user", "parts": answers + (extra or ([] if answers else [{"text": "go on"}]))})
    body: dict[str, Any] = {"contents": contents, "generationConfig": {"temperature": 0}}
    if draw(st.booleans()):
        body = {"systemInstruction": {"role": "user", "parts": [{"text": draw(_text)}]}, **body}
    return body


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gemini_bodies())
def test_contents_round_trip_byte_exact(body: dict[str, Any]) -> None:
    msgs = gemini_convert.read(body)
    assert json.dumps(gemini_convert.write(body, msgs)) == json.dumps(body)
    # the canonical form is a valid chat: every tool message answers a call of the assistant before it
    open_calls: set[str] = set()
    for m in msgs:
        if m["role"] == "assistant":
            open_calls = {c["id"] for c in m.get("tool_calls", [])}
        elif m["role"] == "tool":
            assert m["tool_call_id"] in open_calls
            open_calls.discard(m["tool_call_id"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gemini_bodies(), gemini_bodies())
def test_the_session_history_converts_what_is_new_as_a_fresh_read_would(body: dict[str, Any], other: dict[str, Any]) -> None:
    history = gemini_convert.History()
    contents = body["contents"]
    for n in range(1, len(contents) + 1):  # turn after turn, the history resent and grown
        turn = {**body, "contents": json.loads(json.dumps(contents[:n]))}
        assert history.read(turn) == gemini_convert.read(turn)
    kept = history.messages
    again = history.read(json.loads(json.dumps(body)))
    assert all(a is b for a, b in zip(again[-len(kept) :], kept, strict=False)) or not kept  # the same objects
    assert history.read(other) == gemini_convert.read(other)  # another history altogether


@settings(max_examples=50, deadline=None)
@given(gemini_bodies())
def test_an_engine_cut_keeps_signatures_and_pairs(body: dict[str, Any]) -> None:
    msgs = [dict(m) for m in gemini_convert.read(body)]
    for m in msgs:
        if m["role"] == "tool":
            m["content"] = "[cut]"
    out = gemini_convert.write(body, msgs)
    assert gemini_stub.problem(out) is None
    sent = json.dumps(out)
    for c in body["contents"]:
        for p in c["parts"]:
            if "thoughtSignature" in p and "functionCall" in p:
                assert json.dumps(p["thoughtSignature"]) in sent  # a call's signature survives the cut
    assert '"x"' not in json.dumps([p for c in out["contents"] for p in c["parts"] if "functionResponse" in p])


def test_engine_messages_are_written_as_contents() -> None:
    msgs = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "[summary of earlier turns]"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "gemini_r_0", "type": "function", "function": {"name": "ctx_grep", "arguments": '{"q": "a"}'}}]},
        {"role": "tool", "tool_call_id": "gemini_r_0", "content": "found"},
    ]
    out = gemini_convert.write({"contents": []}, msgs)
    assert out["systemInstruction"] == {"parts": [{"text": "sys"}]}
    assert out["contents"] == [
        {"role": "user", "parts": [{"text": "[summary of earlier turns]"}]},
        {"role": "model", "parts": [{"functionCall": {"name": "ctx_grep", "args": {"q": "a"}}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "ctx_grep", "response": {"output": "found"}}}]},
    ]


def test_bad_contents_are_named() -> None:
    assert GEMINI.problem({"model": MODEL, "contents": [{"role": "tool", "parts": []}]}) == "contents[0]: role must be 'user' or 'model', not 'tool'"
    assert GEMINI.problem({"model": MODEL}) == "'contents' is required and must be a list"
    assert "path must name a model" in str(GEMINI.problem({"contents": []}))


def test_usage_errors_and_the_key() -> None:
    u = normalize_usage({"promptTokenCount": 1200, "cachedContentTokenCount": 1000, "candidatesTokenCount": 30, "thoughtsTokenCount": 20, "totalTokenCount": 1250})
    assert (u.prompt_tokens, u.cache_read_tokens, u.completion_tokens, u.total_tokens) == (1200, 1000, 50, 1250)
    err = json.dumps({"error": {"code": 400, "message": "The input token count (1200293) exceeds the maximum number of tokens allowed (1048576).", "status": "INVALID_ARGUMENT"}}).encode()
    assert is_context_length_error(400, err) and context_limit_from_error(400, err) == 1_048_576
    assert GEMINI.error(404, "no") == {"error": {"code": 404, "message": "no", "status": "NOT_FOUND"}}
    headers: dict[str, str] = {}
    assert key_to_header("alt=sse&key=" + KEY, headers) == "alt=sse" and headers == {"x-goog-api-key": KEY}


# -- through the proxy ------------------------------------------------------------------------


class Files:
    """A workspace the scripted model reads one file of per turn, then answers."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.done = 0
        self.contents = {f"src/mod{i}.py": "\n".join(f"def f{i}_{j}(x):  # code {i}-{j}\n    return x * {j}" for j in range(320)) for i in range(steps)}

    def reply(self, request: RecordedRequest) -> StubReply:
        if self.done >= self.steps:
            return StubReply(text="All files read.")
        self.done += 1
        return StubReply.calling(("read_file", {"path": f"src/mod{self.done - 1}.py"}), text=f"Reading file {self.done - 1}.")


def _proxy(stub: StubServer, tmp_path: Path) -> ProxyServer:
    cfg = Config().with_overrides(
        proxy={"openai_base_url": stub.openai_base_url, "anthropic_base_url": stub.anthropic_base_url, "gemini_base_url": stub.gemini_base_url},
        store={"path": str(tmp_path / "sessions.db")},
        models={MODEL: {"context_length": WINDOW}},
    )
    return ProxyServer(cfg)


def _events(text: str) -> list[dict[str, Any]]:
    return [json.loads(e[len("data: ") :]) for e in text.replace("\r\n", "\n").split("\n\n") if e.startswith("data: ")]


def _run_agent(p: ProxyServer, files: Files, *, stream: bool, via_query: bool) -> tuple[list[Any], int]:
    """Gemini CLI's loop: the whole history each turn, the model's parts sent back as they came."""
    base = p.gemini_base_url
    contents: list[Any] = [{"role": "user", "parts": [{"text": "Read every file under src/ and summarise it."}]}]
    sent = 0
    for _ in range(files.steps + 2):
        body = {"contents": contents, "systemInstruction": SYSTEM, "tools": TOOLS, "generationConfig": {"temperature": 0}}
        sent += len(json.dumps(contents)) // 4
        method = "streamGenerateContent?alt=sse" if stream else "generateContent"
        url = f"{base}/v1beta/models/{MODEL}:{method}" + (f"&key={KEY}" if stream and via_query else f"?key={KEY}" if via_query else "")
        r = httpx.post(url, json=body, headers={} if via_query else {"x-goog-api-key": KEY}, timeout=30)
        assert r.status_code == 200, r.text
        if stream:
            parts = [part for e in _events(r.text) for part in e["candidates"][0]["content"]["parts"]]
        else:
            parts = r.json()["candidates"][0]["content"]["parts"]
        contents.append({"role": "model", "parts": parts})
        calls = [part["functionCall"] for part in parts if "functionCall" in part]
        if not calls:
            break
        contents.append({"role": "user", "parts": [{"functionResponse": {"name": c["name"], "response": {"output": files.contents[c["args"]["path"]]}}} for c in calls]})
    return contents, sent


@pytest.mark.parametrize(("stream", "via_query"), [(True, True), (False, False)])
def test_a_gemini_cli_session_compacts_with_valid_requests(tmp_path: Path, stream: bool, via_query: bool, caplog: pytest.LogCaptureFixture) -> None:
    files = Files(steps=10)
    caplog.set_level(logging.DEBUG, logger="ctxengine")
    with StubServer(responder=files.reply) as stub, _proxy(stub, tmp_path) as p:
        contents, sent = _run_agent(p, files, stream=stream, via_query=via_query)
        assert "".join(part.get("text", "") for part in contents[-1]["parts"]) == "All files read."
        # countTokens: answered through the proxy with what it would send
        r = httpx.post(f"{p.gemini_base_url}/v1beta/models/{MODEL}:countTokens", json={"contents": contents}, headers={"x-goog-api-key": KEY})
        assert r.status_code == 200 and r.json()["totalTokens"] < len(json.dumps(contents)) // 4
        upstream = list(stub.requests)
    assert len(upstream) == files.steps + 1
    for req in upstream:
        assert req.path == f"/v1beta/models/{MODEL}:" + ("streamGenerateContent" if stream else "generateContent")
        assert gemini_stub.problem(req.body) is None, json.dumps(req.body["contents"])[:3000]
        assert count_request_tokens({"system": req.body["systemInstruction"], "messages": req.body["contents"], "tools": req.body["tools"]}) <= WINDOW
        assert req.headers["x-goog-api-key"] == KEY and "key=" not in req.query  # forwarded, as a header
        assert "model" not in req.body and "stream" not in req.body and "ctxengine:route" not in req.body
        assert ("alt=sse" in req.query) is stream
    # the history outgrew the window and the proxy compacted: the last request is far smaller
    client_tokens = len(json.dumps(contents)) // 4
    assert client_tokens > 2 * WINDOW
    last = upstream[-1].body["contents"]
    assert len(json.dumps(last)) // 4 < WINDOW
    # the signature of the model's first function call went back byte-exact
    assert any(p.get("thoughtSignature") == "c2lnbmF0dXJl" for c in last for p in c["parts"])
    saved = 1 - sum(len(gemini_stub.contents_text(r.body)) for r in upstream) / 4 / sent
    print(f"input saved: {saved:.0%}")
    assert saved >= 0.5
    # the key is never logged nor stored
    assert KEY not in caplog.text
    db = (tmp_path / "sessions.db").read_bytes()
    for extra in tmp_path.glob("sessions.db-*"):
        db += extra.read_bytes()
    assert KEY.encode() not in db and b"c2lnbmF0dXJl" in db  # (the store holds the turns)


def test_turns_continue_one_session(tmp_path: Path) -> None:
    files = Files(steps=3)
    with StubServer(responder=files.reply) as stub, _proxy(stub, tmp_path) as p:
        _run_agent(p, files, stream=True, via_query=False)
        sessions = {s.id for s in p.proxy.sessions if s.api == "gemini"}
    assert len(sessions) == 1


@pytest.mark.parametrize("stream", [True, False])
def test_recall_tools_are_declared_and_answered_by_the_proxy(tmp_path: Path, stream: bool) -> None:
    files = Files(steps=10)
    recalled: list[bool] = []

    def reply(request: RecordedRequest) -> StubReply:
        decls = [d["name"] for t in request.body.get("tools", []) for d in t.get("functionDeclarations", [])]
        answered = any("functionResponse" in p and p["functionResponse"]["name"] == "ctx_grep" for c in request.body["contents"] for p in c["parts"])
        if "ctx_grep" in decls and not recalled:
            recalled.append(True)
            return StubReply.calling(("ctx_grep", {"pattern": "code 0-1"}))
        if answered:
            recalled.append(answered)
        return files.reply(request)

    with StubServer(responder=reply) as stub, _proxy(stub, tmp_path) as p:
        contents, _ = _run_agent(p, files, stream=stream, via_query=False)
    assert len(recalled) >= 2  # the model called ctx_grep and the next round carried its answer
    client_calls = [p["functionCall"]["name"] for c in contents for p in c["parts"] if "functionCall" in p]
    assert "ctx_grep" not in client_calls  # the client never saw the proxy's tool
    for req in stub.requests:
        assert gemini_stub.problem(req.body) is None


def test_errors_are_gemini_shaped(tmp_path: Path) -> None:
    with StubServer([StubReply.fail(429, "quota", retry_after_ms=None)]) as stub, _proxy(stub, tmp_path) as p:
        url = f"{p.gemini_base_url}/v1beta/models/{MODEL}:generateContent"
        r = httpx.post(url, json={"contents": "nope"}, headers={"x-goog-api-key": KEY})
        assert r.status_code == 400 and r.json() == {"error": {"code": 400, "message": "'contents' is required and must be a list", "status": "INVALID_ARGUMENT"}}
        r = httpx.post(url, content=b"{", headers={"x-goog-api-key": KEY})
        assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT"
        r = httpx.post(url, json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}, headers={"x-goog-api-key": KEY})
        assert r.status_code == 429 and r.json()["error"]["status"] == "RESOURCE_EXHAUSTED"  # the upstream's, relayed
        r = httpx.get(f"{p.gemini_base_url}/v1beta/models?key={KEY}")
        assert r.status_code == 200  # any other Gemini path is forwarded


def test_a_context_length_rejection_is_learnt_and_retried(tmp_path: Path) -> None:
    too_long = StubReply(text=None, status=400, error="The input token count (20000) exceeds the maximum number of tokens allowed (8000).")
    files = Files(steps=4)
    with StubServer(responder=files.reply) as stub, _proxy(stub, tmp_path) as p:
        contents, _ = _run_agent(p, files, stream=False, via_query=False)
        stub.script(too_long)
        body = {"contents": [*contents, {"role": "user", "parts": [{"text": "and now?"}]}], "systemInstruction": SYSTEM, "tools": TOOLS}
        r = httpx.post(f"{p.gemini_base_url}/v1beta/models/{MODEL}:generateContent", json=body, headers={"x-goog-api-key": KEY})
        assert r.status_code == 200, r.text
        retried = stub.requests[-1].body
    assert count_request_tokens({"system": retried["systemInstruction"], "messages": retried["contents"], "tools": retried["tools"]}) <= 8000



def test_a_stream_without_tools_is_relayed_as_it_came_and_its_usage_read(tmp_path: Path) -> None:
    with StubServer([StubReply(text="Hello there, how can I help?", chunks=3)]) as stub, _proxy(stub, tmp_path) as p:
        body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
        r = httpx.post(f"{p.gemini_base_url}/v1/models/{MODEL}:streamGenerateContent?alt=sse", content=json.dumps(body), headers={"x-goog-api-key": KEY})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = _events(r.text)
        assert len(events) == 3 and events[-1]["candidates"][0]["finishReason"] == "STOP"
        assert "".join(e["candidates"][0]["content"]["parts"][0]["text"] for e in events) == "Hello there, how can I help?"
        deadline = time.monotonic() + 5  # the usage is read once the stream has ended
        while 'ctxengine_proxy_requests_total{api="gemini",outcome="ok"} 1.0' not in httpx.get(p.url + "/metrics").text:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert stub.requests[0].path == f"/v1/models/{MODEL}:streamGenerateContent"
        assert stub.requests[0].raw == json.dumps(body).encode()  # nothing to change: the client's bytes
        (mgr,) = [m for (api, _), m in p.proxy._managers.items() if api == "gemini"]
        (sid,) = [s.id for s in p.proxy.sessions if s.api == "gemini"]
        assert mgr.counters(sid)["last_tokens"] > 0


def test_count_tokens_bodies_and_cached_content() -> None:
    from ctxengine.proxy.gemini import count_body

    sent = {"contents": [{"role": "user", "parts": [{"text": "[summary]"}]}]}
    history = [{"role": "user", "parts": [{"text": "a"}]}, {"role": "model", "parts": [{"text": "b"}]}]
    new = {"role": "user", "parts": [{"text": "c"}]}
    assert count_body({"contents": [*history, new]}, sent, 2, history[-1]) == {"contents": [*sent["contents"], new]}
    wrapped = {"generateContentRequest": {"model": f"models/{MODEL}", "contents": [*history, new]}}
    assert count_body(wrapped, sent, 2, history[-1]) == {"generateContentRequest": {"model": f"models/{MODEL}", "contents": [*sent["contents"], new]}}
    assert count_body({"contents": [new]}, sent, 2, history[-1]) is None  # another conversation: counted as it came
    assert GEMINI.passthrough_reason({"contents": [], "cachedContent": "cachedContents/abc"}) is not None
    assert GEMINI.passthrough_reason({"contents": []}) is None


@settings(max_examples=30, deadline=None)
@given(gemini_bodies())
def test_a_write_reuses_the_contents_of_unchanged_messages(body: dict[str, Any]) -> None:
    memo: gemini_convert.Memo = {}
    msgs = gemini_convert.read(body)
    first = gemini_convert.write(body, msgs, memo)
    again = gemini_convert.write(body, msgs, memo)
    assert json.dumps(again) == json.dumps(first) == json.dumps(body)
    assert all(a is b for a, b in zip(again["contents"], first["contents"], strict=True))
    changed = [dict(m, content="[cut]") if m["role"] == "tool" else m for m in msgs]
    assert json.dumps(gemini_convert.write(body, changed, memo)) == json.dumps(gemini_convert.write(body, changed))


@pytest.mark.parametrize(
    ("base", "url"),
    [
        ("https://generativelanguage.googleapis.com", "https://generativelanguage.googleapis.com/v1beta/models/m:generateContent?alt=sse"),
        ("http://gw.local/gemini/v1beta/", "http://gw.local/gemini/v1beta/models/m:generateContent?alt=sse"),
        ("http://gw.local/v1", "http://gw.local/v1/models/m:generateContent?alt=sse"),
    ],
)
def test_the_upstream_url_keeps_the_path_and_a_base_of_its_own_version(base: str, url: str) -> None:
    from ctxengine.proxy.app import Proxy

    proxy = Proxy(Config().with_overrides(proxy={"gemini_base_url": base}), store=None)
    assert proxy._upstream(GEMINI, "/v1beta/models/m:generateContent", "alt=sse") == url


def test_a_stream_without_alt_sse_is_a_json_array_relayed_unchanged(tmp_path: Path) -> None:
    array = b'[{"candidates": [{"content": {"role": "model", "parts": [{"text": "hi"}]}, "finishReason": "STOP", "index": 0}]}]'
    with StubServer([StubReply(raw_body=array)]) as stub, _proxy(stub, tmp_path) as p:
        raw = json.dumps({"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "tools": TOOLS}).encode()
        r = httpx.post(f"{p.gemini_base_url}/v1beta/models/{MODEL}:streamGenerateContent", content=raw, headers={"x-goog-api-key": KEY})
        assert r.status_code == 200 and r.content == array  # no failure event appended, nothing added
        assert stub.requests[0].raw == raw


def test_a_query_key_is_a_header_from_the_start_so_two_users_are_two_sessions(tmp_path: Path) -> None:
    body = {"contents": [{"role": "user", "parts": [{"text": "hello"}]}]}
    with StubServer() as stub, _proxy(stub, tmp_path) as p:
        url = f"{p.gemini_base_url}/v1beta/models/{MODEL}:generateContent"
        one = httpx.post(url + "?key=user-one-key", json=body).headers["x-ctxengine-session"]
        two = httpx.post(url + "?key=user-two-key", json=body).headers["x-ctxengine-session"]
        keys = [r.headers["x-goog-api-key"] for r in stub.requests]
    assert one != two and "user-one-key" not in one and one.startswith("px-")
    assert keys == ["user-one-key", "user-two-key"]
