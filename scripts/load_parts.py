"""The processes ``bench_load.py`` runs beside the proxy, each a small asyncio program on 127.0.0.1:

* ``upstream``: an upstream that answers at once (a JSON completion, or a short stream, in the
  API's shape), optionally with faults on a share of requests (500, 429 with ``retry-after``, a
  reset mid-stream, a stall); it logs the hash of each body it receives with the client's
  ``x-bench-turn`` header (the two-process comparison).
* ``forwarder``: the do-nothing forwarder, the limit of a Python proxy: each client connection
  gets one upstream connection; bytes are copied both ways, a response read to its end by its
  ``content-length`` or its chunked framing.

    python scripts/load_parts.py upstream PORT [--faults 0.05] [--log FILE] [--stall 3]
    python scripts/load_parts.py forwarder PORT UPSTREAM_PORT
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import socket
import struct
from typing import IO


async def read_head(r: asyncio.StreamReader) -> tuple[bytes, dict[bytes, bytes]]:
    head = await r.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    fields = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(b":") for ln in lines[1:] if ln)}
    return head, fields


async def copy_body(r: asyncio.StreamReader, w: asyncio.StreamWriter | None, fields: dict[bytes, bytes]) -> bytes:
    """Read a message body by its framing; copy it to ``w`` as read; return it (whole)."""
    if b"content-length" in fields:
        data = await r.readexactly(int(fields[b"content-length"]))
        if w is not None:
            w.write(data)
        return data
    if fields.get(b"transfer-encoding", b"").lower() != b"chunked":
        return b""
    out = bytearray()
    while True:
        size_line = await r.readuntil(b"\r\n")
        n = int(size_line.split(b";")[0], 16)
        chunk = await r.readexactly(n + 2)
        if w is not None:
            w.write(size_line + chunk)
            await w.drain()
        out += chunk[:-2]
        if n == 0:
            return bytes(out)


# -- the upstream -----------------------------------------------------------------------------
def _json_reply(anthropic: bool, n: int) -> bytes:
    text = f"answer to turn {n}"
    if anthropic:
        body = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude", "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "usage": {"input_tokens": 100, "output_tokens": 5}}
    else:
        body = {"id": "c1", "object": "chat.completion", "model": "gpt-4o", "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105}}
    return json.dumps(body).encode()


def _events(anthropic: bool, n: int) -> list[bytes]:
    text = f"answer to turn {n}"
    if not anthropic:
        chunk = {"id": "c1", "object": "chat.completion.chunk", "model": "gpt-4o", "choices": [{"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": None}]}
        last = {"id": "c1", "object": "chat.completion.chunk", "model": "gpt-4o", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105}}
        return [b"data: " + json.dumps(chunk).encode() + b"\n\n", b"data: " + json.dumps(last).encode() + b"\n\n", b"data: [DONE]\n\n"]
    seq = [
        ("message_start", {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude", "content": [], "stop_reason": None, "usage": {"input_tokens": 100, "output_tokens": 1}}}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 5}}),
        ("message_stop", {"type": "message_stop"}),
    ]
    return [f"event: {k}\ndata: {json.dumps(d)}\n\n".encode() for k, d in seq]


class Upstream:
    def __init__(self, faults: float, log: IO[str] | None, stall: float, seed: int) -> None:
        self.faults, self.log, self.stall = faults, log, stall
        self.rng = random.Random(seed)

    def fault(self) -> str:
        if self.faults <= 0 or self.rng.random() >= self.faults:
            return "ok"
        return self.rng.choice(["500", "429", "reset", "stall"])

    async def serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while True:
                head, fields = await read_head(r)
                body = await copy_body(r, None, fields)
                if not await self.answer(w, head, fields, body):
                    return
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            w.close()

    async def answer(self, w: asyncio.StreamWriter, head: bytes, fields: dict[bytes, bytes], body: bytes) -> bool:
        path = head.split(b" ", 2)[1]
        if path.endswith(b"/healthz"):
            w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            return True
        anthropic = path.endswith(b"/messages")
        req = json.loads(body or b"{}")
        if self.log is not None and b"x-bench-turn" in fields:
            self.log.write(f"{fields[b'x-bench-turn'].decode()} {hashlib.sha1(body).hexdigest()}\n")
            self.log.flush()
        fault = self.fault()
        if fault in ("500", "429"):
            err = json.dumps({"type": "error", "error": {"type": "overloaded_error" if fault == "500" else "rate_limit_error", "message": "injected fault"}}).encode()
            extra = b"retry-after: 0\r\n" if fault == "429" else b""
            w.write(b"HTTP/1.1 %s Fault\r\ncontent-type: application/json\r\n%scontent-length: %d\r\n\r\n%s" % (fault.encode(), extra, len(err), err))
            return True
        if fault == "stall":
            await asyncio.sleep(self.stall)
            return False
        n = len(req.get("messages", []))
        if not req.get("stream"):
            if fault == "reset":
                _reset(w)
                return False
            data = _json_reply(anthropic, n)
            w.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(data), data))
            return True
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for i, ev in enumerate(_events(anthropic, n)):
            if fault == "reset" and i == 2:
                await w.drain()
                _reset(w)
                return False
            w.write(b"%x\r\n%s\r\n" % (len(ev), ev))
        w.write(b"0\r\n\r\n")
        await w.drain()
        return True


def _reset(w: asyncio.StreamWriter) -> None:
    sock = w.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    w.transport.abort()


# -- the do-nothing forwarder ------------------------------------------------------------------
async def forward(r: asyncio.StreamReader, w: asyncio.StreamWriter, port: int) -> None:
    """One client connection: each request copied to one upstream connection, its response back."""
    ur, uw = await asyncio.open_connection("127.0.0.1", port)
    try:
        while True:
            head, fields = await read_head(r)
            uw.write(head)
            await copy_body(r, uw, fields)
            await uw.drain()
            rhead, rfields = await read_head(ur)
            w.write(rhead)
            await copy_body(ur, w, rfields)
            await w.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        uw.close()
        w.close()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["upstream", "forwarder"])
    ap.add_argument("port", type=int)
    ap.add_argument("upstream_port", type=int, nargs="?")
    ap.add_argument("--faults", type=float, default=0.0)
    ap.add_argument("--stall", type=float, default=3.0)
    ap.add_argument("--log")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.what == "upstream":
        up = Upstream(a.faults, open(a.log, "a", encoding="utf-8") if a.log else None, a.stall, a.seed)  # noqa: SIM115
        server = await asyncio.start_server(up.serve, "127.0.0.1", a.port, limit=2**26, backlog=1024)
    else:
        port = int(a.upstream_port)
        server = await asyncio.start_server(lambda r, w: forward(r, w, port), "127.0.0.1", a.port, limit=2**26, backlog=1024)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
