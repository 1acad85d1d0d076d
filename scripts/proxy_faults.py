"""The proxy under faults: scripted 127.0.0.1 upstreams, a client that leaves, a proxy killed
mid-turn, a store that goes away (used by ``fault_campaign.py``: classes ``proxy-upstream``,
``proxy-client``, ``proxy-restart``, ``proxy-store``).

Each case drives a session of a few turns through a proxy (in-process :class:`ProxyServer`, or
the ``ctxengine proxy`` command in a subprocess when it is killed) and judges:

* **hang**: a request that took longer than the proxy's ``timeout`` plus a margin to end.
* **crash**: an answer that is neither the provider's (a stream with its last event, a JSON
  completion) nor a clear error in the API's shape (an HTTP error with the API's error body,
  or an ``error`` event in the stream followed by its proper end).
* **lost** / **duplicate**: once the proxy has stopped, the session's history in the store
  differs from what the client sent: a message missing, or one recorded more than once.

The worst time from a request to its clear error is kept in ``MEASURES["proxy_error_seconds"]``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx

TIMEOUT = 2.0
"""The proxy's ``timeout`` in every case: a stall must become an error within it."""
SLACK = 3.0
"""What a request may take beyond the timeout before it counts as hung."""

Msg = dict[str, Any]


# -- a scripted upstream -----------------------------------------------------------------------------
@dataclass
class Upstream:
    """A raw HTTP/1.1 server on 127.0.0.1 answering each request as ``script`` says (one fault
    name per request, then ``"ok"``). Faults: ``ok``, ``trickle-stream`` (events 0.6 s apart),
    ``stall-stream`` (two events, then silence), ``cut-clean`` (two events, then the end of the
    body without the last event), ``cut-abrupt`` (two events, then the connection closed),
    ``trickle-body`` (a JSON body at 2 bytes/s), ``stall-head``, ``reset``, ``slow-stream``
    (events 0.3 s apart, for a client that leaves)."""

    script: list[str] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    closed_early: list[float] = field(default_factory=list)  # when a client of ours went away mid-body
    slow_finished: int = 0  # slow streams sent to their end (their reader never left)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = int(self.sock.getsockname()[1])
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True, name="campaign-upstream").start()

    def close(self) -> None:
        self.stop.set()
        with contextlib.suppress(OSError):
            self.sock.close()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(30)
        buf = b""
        try:
            while not self.stop.is_set():
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                length = next((int(v.split(":", 1)[1]) for v in lines[1:] if v.lower().startswith("content-length:")), 0)
                while len(buf) < length:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                body, buf = buf[:length], buf[length:]
                req = json.loads(body or b"{}")
                with self._lock:
                    self.requests.append(req)
                    fault = self.script.pop(0) if self.script else "ok"
                if not self._answer(conn, path, req, fault):
                    return
        except OSError:
            return
        finally:
            with contextlib.suppress(OSError):
                conn.close()

    # -- answers
    def _answer(self, conn: socket.socket, path: str, req: dict[str, Any], fault: str) -> bool:
        """Answer one request; False when the connection is done."""
        anthropic = path.endswith("/messages")
        if fault == "reset":
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            return False
        if fault == "stall-head":
            self.stop.wait(60)
            return False
        text = f"answer to turn {len(req.get('messages', []))}"
        if not req.get("stream"):
            payload = _anthropic_message(text) if anthropic else _openai_completion(text)
            data = json.dumps(payload).encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(data))
            if fault == "trickle-body":
                for i in range(0, len(data), 2):
                    if self.stop.wait(1.0):
                        return False
                    conn.sendall(data[i : i + 2])
            else:
                conn.sendall(data)
            return True
        events = _anthropic_events(text) if anthropic else _openai_events(text)
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        gap = {"trickle-stream": 0.6, "slow-stream": 0.3}.get(fault, 0.0)
        for n, event in enumerate(events):
            if fault in ("stall-stream", "cut-clean", "cut-abrupt") and n == 2:
                if fault == "stall-stream":
                    self.stop.wait(60)
                    return False
                if fault == "cut-clean":
                    conn.sendall(b"0\r\n\r\n")
                    return True
                return False  # cut-abrupt: the connection closes mid-body
            try:
                conn.sendall(b"%x\r\n%s\r\n" % (len(event), event))
            except OSError:
                with self._lock:
                    self.closed_early.append(time.monotonic())
                return False
            if gap and self.stop.wait(gap):
                return False
        conn.sendall(b"0\r\n\r\n")
        if fault == "slow-stream":
            with self._lock:
                self.slow_finished += 1
        return True


def _openai_completion(text: str) -> dict[str, Any]:
    return {
        "id": "c1", "object": "chat.completion", "model": "gpt-4o",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105},
    }


def _anthropic_message(text: str) -> dict[str, Any]:
    return {
        "id": "m1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": 100, "output_tokens": 5},
    }


def _openai_events(text: str) -> list[bytes]:
    words = text.split(" ")
    out = [b"data: " + json.dumps({"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}).encode() + b"\n\n"]
    for w in words:
        out.append(b"data: " + json.dumps({"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": w + " "}}]}).encode() + b"\n\n")
    out.append(b"data: " + json.dumps({"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 100, "completion_tokens": 5}}).encode() + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return out


def _sse(kind: str, data: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


def _anthropic_events(text: str) -> list[bytes]:
    out = [
        _sse("message_start", {"type": "message_start", "message": {"id": "m1", "type": "message", "role": "assistant", "content": [], "model": "claude-sonnet-4-5", "usage": {"input_tokens": 100, "output_tokens": 1}}}),
        _sse("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    ]
    for w in text.split(" "):
        out.append(_sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": w + " "}}))
    out += [
        _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        _sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 5}}),
        _sse("message_stop", {"type": "message_stop"}),
    ]
    return out


# -- the client ------------------------------------------------------------------------------------------
@dataclass
class Reply:
    kind: str  # "answer", "error" (clear, in the API's shape), "unclear", "hang"
    seconds: float
    detail: str = ""
    text: str = ""


def _clear_error_body(api: str, body: bytes) -> bool:
    try:
        data = json.loads(body)
    except ValueError:
        return False
    if api == "anthropic":
        return isinstance(data, dict) and data.get("type") == "error" and isinstance(data.get("error"), dict) and bool(data["error"].get("message"))
    return isinstance(data, dict) and isinstance(data.get("error"), dict) and bool(data["error"].get("message"))


def send(base: str, api: str, session: str, messages: list[Msg], *, stream: bool, leave_after: int | None = None) -> Reply:
    """One chat request through the proxy, judged (see the module docstring)."""
    url = f"{base}/v1/messages" if api == "anthropic" else f"{base}/v1/chat/completions"
    headers = {"x-ctxengine-session": session, "content-type": "application/json"}
    if api == "anthropic":
        headers |= {"x-api-key": "sk-ant-campaign-key-000000000000", "anthropic-version": "2023-06-01"}
        body: dict[str, Any] = {"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": messages}
    else:
        headers["authorization"] = "Bearer sk-campaign-key-0000000000000000"
        body = {"model": "gpt-4o", "messages": messages}
    if stream:
        body["stream"] = True
    limit = TIMEOUT + SLACK
    t0 = time.monotonic()
    try:
        with httpx.Client(timeout=httpx.Timeout(limit)) as client:
            if not stream:
                r = client.post(url, headers=headers, content=json.dumps(body))
                took = time.monotonic() - t0
                if r.status_code == 200:
                    data = r.json()
                    text = data["content"][0]["text"] if api == "anthropic" else data["choices"][0]["message"]["content"]
                    return Reply("answer", took, text=text)
                if _clear_error_body(api, r.content):
                    return Reply("error", took, f"{r.status_code}: {r.text[:120]}")
                return Reply("unclear", took, f"{r.status_code}: {r.text[:120]}")
            with client.stream("POST", url, headers=headers, content=json.dumps(body)) as r:
                if r.status_code != 200:
                    content = r.read()
                    took = time.monotonic() - t0
                    return Reply("error" if _clear_error_body(api, content) else "unclear", took, f"{r.status_code}: {content[:120]!r}")
                events: list[str] = []
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        events.append(line[5:].strip())
                        if leave_after is not None and len(events) >= leave_after:
                            return Reply("left", time.monotonic() - t0)
                took = time.monotonic() - t0
    except httpx.TimeoutException:
        return Reply("hang", time.monotonic() - t0, f"no end within {limit:g}s")
    except httpx.HTTPError as exc:
        return Reply("unclear", time.monotonic() - t0, f"{type(exc).__name__}: {exc}")
    return _judge_stream(api, events, took)


def _judge_stream(api: str, events: list[str], took: float) -> Reply:
    parsed = []
    for e in events:
        if e == "[DONE]":
            parsed.append("[DONE]")
            continue
        try:
            parsed.append(json.loads(e))
        except ValueError:
            return Reply("unclear", took, f"an event that is not JSON: {e[:80]}")
    errors = [p for p in parsed if isinstance(p, dict) and (p.get("type") == "error" or "error" in p)]
    if errors:
        err = errors[-1]
        ok = _clear_error_body(api, json.dumps(err).encode())
        last_is_error = parsed[-1] is err or (api == "openai" and parsed[-1] == "[DONE]" and parsed[-2] is err)
        return Reply("error" if ok and last_is_error else "unclear", took, json.dumps(err)[:160])
    if api == "anthropic":
        done = bool(parsed) and isinstance(parsed[-1], dict) and parsed[-1].get("type") == "message_stop"
        text = "".join(p["delta"].get("text", "") for p in parsed if isinstance(p, dict) and p.get("type") == "content_block_delta")
    else:
        done = bool(parsed) and parsed[-1] == "[DONE]"
        text = "".join(str((p["choices"][0].get("delta") or {}).get("content") or "") for p in parsed if isinstance(p, dict) and p.get("choices"))
    if done:
        return Reply("answer", took, text=text)
    return Reply("unclear", took, f"the stream ended after {len(parsed)} events without its last event or an error")


# -- the proxy -------------------------------------------------------------------------------------------
def proxy_config(up: Upstream, store: dict[str, Any]) -> dict[str, Any]:
    return {
        "proxy": {"timeout": TIMEOUT, "openai_base_url": f"http://127.0.0.1:{up.port}/v1", "anthropic_base_url": f"http://127.0.0.1:{up.port}"},
        "store": store,
        "model": {"context_length": 1_000_000},  # no compaction: the store must hold exactly what was sent
    }


def history_check(store: Any, session: str, sent: list[Msg], api: str) -> tuple[str, str] | None:
    """``("lost"|"duplicate", detail)`` when the store's history of ``session`` is not exactly
    the messages of the client's last request; ``None`` when it is."""
    try:
        stored = store.history(session)
    except Exception as exc:
        return "lost", f"the session is not in the store: {type(exc).__name__}: {exc}"
    want = [json.dumps(m, sort_keys=True) for m in sent]
    have = [json.dumps(m, sort_keys=True) for m in stored]
    if api == "anthropic":  # the store keeps the canonical form: compare texts
        want = [str(m.get("content")) for m in sent]
        have = [_text(m) for m in stored]
    for w in set(have):
        if have.count(w) > want.count(w):
            return "duplicate", f"{w[:60]} recorded {have.count(w)} times, sent {want.count(w)}"
    missing = [w for w in want if w not in have]
    if missing:
        return "lost", f"{len(missing)} of {len(want)} messages not in the store (first: {missing[0][:60]})"
    return None


def _text(m: Msg) -> str:
    c = m.get("content")
    if isinstance(c, list):
        return "".join(str(p.get("text", "")) for p in c if isinstance(p, dict))
    return str(c)


@dataclass
class Turns:
    """A client session: it appends its user turn and the answer it got, turn after turn."""

    api: str
    session: str
    messages: list[Msg] = field(default_factory=list)
    replies: list[Reply] = field(default_factory=list)

    def turn(self, base: str, n: int, *, stream: bool, leave_after: int | None = None, resend: bool = False) -> Reply:
        if not resend:
            self.messages.append({"role": "user", "content": f"{self.session} user turn {n}: do step {n}"})
        r = send(base, self.api, self.session, list(self.messages), stream=stream, leave_after=leave_after)
        self.replies.append(r)
        if r.kind == "answer":
            self.messages.append({"role": "assistant", "content": r.text})
        return r


def judge(replies: list[Reply], measures: dict[str, list[float]]) -> tuple[str, str] | None:
    """The first reply that is a hang or an unclear answer; error times go to the measures."""
    for i, r in enumerate(replies):
        # an answer may take long while its bytes move (a trickling stream); anything else may not
        if r.kind == "hang" or (r.kind != "answer" and r.seconds > TIMEOUT + SLACK):
            return "hang", f"request {i}: {r.seconds:.1f}s ({r.detail})"
        if r.kind == "unclear":
            return "crash", f"request {i}: not an answer nor a clear error: {r.detail}"
        if r.kind == "error":
            measures.setdefault("proxy_error_seconds", []).append(r.seconds)
    return None


# -- cases --------------------------------------------------------------------------------------------------
CaseFn = Callable[[], "tuple[str, str]"]


def upstream_cases(work: Path, measures: dict[str, list[float]]) -> Iterator[tuple[str, str, CaseFn]]:
    from ctxengine.config import Config
    from ctxengine.proxy.server import ProxyServer
    from ctxengine.store import SqliteStore

    faults = [
        ("trickle-stream", True),
        ("stall-stream", True),
        ("cut-clean", True),
        ("cut-abrupt", True),
        ("trickle-body", False),
        ("stall-head", False),
        ("stall-head", True),
        ("reset", False),
        ("reset", True),
    ]
    for api in ("openai", "anthropic"):
        for fault, stream in faults:

            def run(api: str = api, fault: str = fault, stream: bool = stream) -> tuple[str, str]:
                name = f"{api}-{fault}-{'stream' if stream else 'json'}"
                up = Upstream(script=["ok", fault])
                path = work / f"proxy-{name}.db"
                t = Turns(api, f"s-{name}")
                try:
                    with ProxyServer(Config.from_dict(proxy_config(up, {"path": str(path)}))) as p:
                        t.turn(p.url, 0, stream=stream)
                        t.turn(p.url, 1, stream=stream)  # the fault
                        retry = t.replies[-1].kind != "answer"
                        t.turn(p.url, 1 if retry else 2, stream=stream, resend=retry)  # the session continues
                        t.turn(p.url, 3, stream=stream)
                finally:
                    up.close()
                bad = judge(t.replies, measures)
                if bad:
                    return bad
                if t.replies[-1].kind != "answer" or t.replies[-2].kind != "answer":
                    return "crash", "the session did not continue after the fault"
                with SqliteStore(path) as store:
                    problem = history_check(store, t.session, t.messages[:-1], api)
                return problem or ("clean", f"fault answered as {t.replies[1].kind} in {t.replies[1].seconds:.2f}s")

            yield "proxy-upstream", f"{api}-{fault}-{'stream' if stream else 'json'}", run


def client_cases(work: Path, measures: dict[str, list[float]]) -> Iterator[tuple[str, str, CaseFn]]:
    from ctxengine.config import Config
    from ctxengine.proxy.server import ProxyServer
    from ctxengine.store import SqliteStore

    for api in ("openai", "anthropic"):

        def run(api: str = api) -> tuple[str, str]:
            up = Upstream(script=["ok", "slow-stream"])
            path = work / f"proxy-leave-{api}.db"
            t = Turns(api, f"s-leave-{api}")
            try:
                with ProxyServer(Config.from_dict(proxy_config(up, {"path": str(path)}))) as p:
                    t.turn(p.url, 0, stream=True)
                    left = time.monotonic()
                    t.turn(p.url, 1, stream=True, leave_after=2)  # the client goes away mid-stream
                    t.turn(p.url, 1, stream=True, resend=True)  # and sends the turn again
                    t.turn(p.url, 2, stream=True)
                    # the upstream learns of the close at its next write (0.3 s apart); the slow
                    # stream would need 3 s to its end
                    stop = left + 4.0
                    while not up.closed_early and not up.slow_finished and time.monotonic() < stop:
                        time.sleep(0.05)
                    closed = [c - left for c in up.closed_early]
            finally:
                up.close()
            bad = judge([r for r in t.replies if r.kind != "left"], measures)
            if bad:
                return bad
            if not closed:
                return "waste", "the upstream stream was not closed when the client left (it was sent to its end)"
            with SqliteStore(path) as store:
                problem = history_check(store, t.session, t.messages[:-1], api)
            return problem or ("clean", f"upstream closed {closed[0]:.2f}s after the client left")

        yield "proxy-client", f"{api}-disconnect-mid-stream", run


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_cli(work: Path, cfg: dict[str, Any], port: int) -> subprocess.Popen[bytes]:
    import yaml

    cfg = json.loads(json.dumps(cfg))
    cfg["proxy"]["port"] = port
    f = work / f"proxy-{port}.yaml"
    f.write_text(yaml.safe_dump(cfg))
    proc = subprocess.Popen([sys.executable, "-m", "ctxengine", "proxy", "--config", str(f)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=os.environ.copy())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        if proc.poll() is not None:
            raise RuntimeError(f"the proxy exited: {proc.stderr.read().decode()[-300:] if proc.stderr else ''}")
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the proxy did not start")


def restart_cases(work: Path, measures: dict[str, list[float]]) -> Iterator[tuple[str, str, CaseFn]]:
    from ctxengine.store import SqliteStore

    for api, stream in (("openai", True), ("anthropic", True), ("openai", False)):

        def run(api: str = api, stream: bool = stream) -> tuple[str, str]:
            # the second turn's answer is slow: the proxy is killed (SIGKILL) while it relays it
            up = Upstream(script=["ok", "ok", "slow-stream" if stream else "trickle-body"])
            path = work / f"proxy-kill-{api}-{stream}.db"
            cfg = proxy_config(up, {"path": str(path)})
            t = Turns(api, f"s-kill-{api}-{stream}")
            try:
                port = _free_port()
                proc = _start_cli(work, cfg, port)
                try:
                    base = f"http://127.0.0.1:{port}"
                    t.turn(base, 0, stream=stream)
                    t.turn(base, 1, stream=stream)
                    killer = threading.Timer(0.8, lambda: os.kill(proc.pid, signal.SIGKILL))
                    killer.start()
                    t.turn(base, 2, stream=stream)  # killed mid-turn: the client sees an error
                    killer.join()
                finally:
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                    proc.wait()
                killed = t.replies.pop()
                if killed.kind == "hang":
                    return "hang", f"the client waited {killed.seconds:.1f}s for a killed proxy"
                proc = _start_cli(work, cfg, port)
                try:
                    t.turn(base, 2, stream=stream, resend=True)  # the client sends the turn again
                    t.turn(base, 3, stream=stream)
                finally:
                    proc.send_signal(signal.SIGINT)  # a clean stop: the last turn's write is done
                    try:
                        proc.wait(timeout=20)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        return "hang", "the restarted proxy did not stop on SIGINT"
            finally:
                up.close()
            bad = judge(t.replies, measures)
            if bad:
                return bad
            with SqliteStore(path) as store:
                problem = history_check(store, t.session, t.messages[:-1], api)
            return problem or ("clean", "resumed after SIGKILL")

        yield "proxy-restart", f"{api}-{'stream' if stream else 'json'}-sigkill-mid-turn", run


def store_cases(work: Path, measures: dict[str, list[float]], pg: Callable[[], Any] | None) -> Iterator[tuple[str, str, CaseFn]]:
    from ctxengine.config import Config
    from ctxengine.proxy.server import ProxyServer
    from ctxengine.store import SqliteStore

    for api in ("openai", "anthropic"):

        def sqlite_removed(api: str = api) -> tuple[str, str]:
            up = Upstream()
            path = work / f"proxy-removed-{api}.db"
            t = Turns(api, f"s-removed-{api}")
            try:
                with ProxyServer(Config.from_dict(proxy_config(up, {"path": str(path)}))) as p:
                    for n in range(3):
                        t.turn(p.url, n, stream=n % 2 == 0)
                    time.sleep(0.3)  # the last turn's deferred write
                    for suffix in ("", "-wal", "-shm"):
                        with contextlib.suppress(FileNotFoundError):
                            os.remove(f"{path}{suffix}")
                    for n in range(3, 6):
                        t.turn(p.url, n, stream=n % 2 == 0)
            finally:
                up.close()
            bad = judge(t.replies, measures)
            if bad:
                return bad
            if not path.exists():
                return "lost", "the store file was not recreated: every turn after its removal is gone"
            with SqliteStore(path) as store:
                problem = history_check(store, t.session, t.messages[:-1], api)
            return problem or ("clean", "recreated and recorded in full")

        yield "proxy-store", f"{api}-sqlite-file-removed", sqlite_removed

    if pg is None:
        return

    def pg_restart() -> tuple[str, str]:
        from ctxengine.store.postgres import PostgresStore

        cluster = pg()
        dsn = cluster.new_database()
        os.environ["CTXENGINE_CAMPAIGN_DSN"] = dsn
        up = Upstream()
        t = Turns("openai", "s-pg-restart")
        cfg = proxy_config(up, {"backend": "postgres", "dsn_env": "CTXENGINE_CAMPAIGN_DSN"})
        try:
            with ProxyServer(Config.from_dict(cfg)) as a, ProxyServer(Config.from_dict(cfg)) as b:
                for n in range(3):
                    t.turn((a, b)[n % 2].url, n, stream=n % 2 == 0)
                cluster.restart()
                for n in range(3, 7):
                    t.turn((a, b)[n % 2].url, n, stream=n % 2 == 0)
        finally:
            up.close()
        bad = judge(t.replies, measures)
        if bad:
            return bad
        store = PostgresStore(dsn)
        try:
            problem = history_check(store, t.session, t.messages[:-1], "openai")
        finally:
            store.close()
        return problem or ("clean", "two proxies, PostgreSQL restarted mid-session")

    yield "proxy-store", "postgres-restarted-under-two-proxies", pg_restart


# -- a throwaway PostgreSQL (as tests/store/conftest.py starts one) ------------------------------------------
class PgCluster:
    """A cluster in a temp dir, run as the ``postgres`` user when we are root, on a free port."""

    def __init__(self) -> None:
        import glob
        import pwd
        import shutil
        import tempfile

        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
        if not found:
            raise RuntimeError("no PostgreSQL server binaries in /usr/lib/postgresql/*/bin")
        self.bin = Path(found[-1]).parent
        self.owner = None
        if os.geteuid() == 0:
            pwd.getpwnam("postgres")
            self.owner = "postgres"
        self.root = Path(tempfile.mkdtemp(prefix="ctxengine-campaign-pg-"))
        self.data, sock = self.root / "data", self.root / "sock"
        sock.mkdir()
        if self.owner:
            shutil.chown(self.root, self.owner)
            shutil.chown(sock, self.owner)
        self.port = _free_port()
        self.env = {**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
        subprocess.run(self._cmd("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"), check=True, capture_output=True, env=self.env, cwd=self.root)
        self.opts = f"-p {self.port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100"
        self._ctl("start")
        self._n = 0

    def _cmd(self, name: str, *args: str) -> list[str]:
        cmd = [str(self.bin / name), *args]
        return ["runuser", "-u", self.owner, "--", *cmd] if self.owner else cmd

    def _ctl(self, action: str) -> None:
        args = ["-D", str(self.data), "-w", "-t", "60"]
        if action in ("start", "restart"):
            args += ["-o", self.opts, "-l", str(self.root / "server.log")]
        if action in ("stop", "restart"):
            args += ["-m", "fast"]
        subprocess.run(self._cmd("pg_ctl", *args, action), check=True, capture_output=True, env=self.env, cwd=self.root)

    def dsn(self, db: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={db} connect_timeout=5"

    def new_database(self) -> str:
        import psycopg

        self._n += 1
        name = f"campaign{self._n}"
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def restart(self) -> None:
        self._ctl("restart")

    def stop(self) -> None:
        import shutil

        with contextlib.suppress(subprocess.CalledProcessError):
            self._ctl("stop")
        shutil.rmtree(self.root, ignore_errors=True)
