"""The upstream call (:class:`Relaying`): a whole response, or a stream relayed chunk by chunk as it arrives, with the proxy's tool calls answered on the way (see :mod:`ctxengine.proxy.base` for the layers)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator

import anyio
import orjson
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from ctxengine.proxy.apis import ToolCall
from ctxengine.proxy.base import (
    Plan,
)
from ctxengine.proxy.rounds import RecallRounds
from ctxengine.proxy.streams import EventSplitter, StreamTracker
from ctxengine.proxy.upstream import (
    RawHeaders,
    UpstreamError,
    UpstreamResponse,
)
from ctxengine.proxy.writer import encode

log = logging.getLogger("ctxengine.proxy")


class _RelayResponse(StreamingResponse):
    """A relayed stream whose first chunk goes out from the request's own task.

    Starlette streams from a second task while the request's task watches for the client
    leaving (uvicorn reports ASGI spec 2.3, whose ``send`` does not fail once the client is
    gone). Starting that task group before the first chunk cost time to first byte about
    0.3 ms, measured. Here the response head and the first chunk are sent first, then the
    rest is streamed Starlette's way, watcher included: a client that left while the
    upstream prepared its first chunk is noticed right after that chunk, and the upstream
    stream is closed then as before.
    """

    _head_sent = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        chunks = self.body_iterator.__aiter__()
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        self._head_sent = True
        try:
            first = await chunks.__anext__()
        except StopAsyncIteration:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            if self.background is not None:
                await self.background()
            return
        await send({"type": "http.response.body", "body": first if isinstance(first, bytes | memoryview) else first.encode(self.charset), "more_body": True})
        self.body_iterator = chunks
        await super().__call__(scope, receive, send)

    async def stream_response(self, send: Send) -> None:
        if not self._head_sent:
            await super().stream_response(send)
            return
        async for chunk in self.body_iterator:
            await send({"type": "http.response.body", "body": chunk if isinstance(chunk, bytes | memoryview) else chunk.encode(self.charset), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class Relaying(RecallRounds):
    """See the module docstring."""

    async def _complete(self, plan: Plan, url: str, headers: dict[str, str], extra: RawHeaders, original: bytes) -> Response:
        return self._after(await self._complete_response(plan, url, headers, extra, original), plan)

    async def _complete_response(self, plan: Plan, url: str, headers: dict[str, str], extra: RawHeaders, original: bytes) -> Response:
        started = time.perf_counter()
        api = plan.api
        resp, content = await self._post(url, headers, plan.content)
        plan.stages.append(("upstream", time.perf_counter() - started))
        if resp.status >= 400 and await self._shrink(plan, resp.status, content):
            resp, content = await self._post(url, headers, plan.content)
        if resp.status >= 400:
            self._account(plan, "upstream_error", resp.status, started)
            return self._relayed(resp, content, extra)
        try:
            data = orjson.loads(content)
        except orjson.JSONDecodeError:
            self._account(plan, "ok", resp.status, started)
            return self._relayed(resp, content, extra)
        if not plan.engine_tools or not isinstance(data, dict):
            plan.usage = api.usage(data) if isinstance(data, dict) else None
            self._account(plan, "ok", resp.status, started)
            return self._relayed(resp, content, extra)
        await self._usage(plan, api.usage(data))
        try:
            status, data, resp, content = await self._answer_tools(plan, url, headers, data, resp, content)
        except Exception as exc:  # fail open: the client's own request, unchanged
            self._fail_open(api, plan, "tools", exc)
            resp, content = await self._post(url, headers, original)
            self._account(plan, "fail_open", resp.status, started)
            return self._relayed(resp, content, extra)
        self._account(plan, "ok" if status < 400 else "upstream_error", status, started)
        if status >= 400:
            return self._relayed(resp, content, extra, status)
        out = JSONResponse(data, status_code=status)
        out.raw_headers += [(k, v) for k, v in self._response_headers(resp) if k.lower() != b"content-type"] + extra
        return out

    # -- streaming ------------------------------------------------------------------------------
    async def _stream(self, plan: Plan, url: str, headers: dict[str, str], extra: RawHeaders) -> Response:
        started = time.perf_counter()
        resp = await self.client.send("POST", url, headers, plan.content)
        plan.stages.append(("upstream", time.perf_counter() - started))
        if resp.status >= 400:
            content = await resp.read()
            if await self._shrink(plan, resp.status, content):
                resp = await self.client.send("POST", url, headers, plan.content)
                content = await resp.read() if resp.status >= 400 else b""
        if resp.status >= 400:
            self._account(plan, "upstream_error", resp.status, started)
            return self._after(self._relayed(resp, content, extra), plan)
        out = _RelayResponse(self._relay(plan, url, headers, resp, started), status_code=resp.status)
        out.raw_headers += self._response_headers(resp) + extra
        return self._after(out, plan)

    async def _relay(self, plan: Plan, url: str, headers: dict[str, str], resp: UpstreamResponse, started: float) -> AsyncIterator[bytes]:
        api = plan.api
        tracker: StreamTracker = api.tracker(plan.engine_tools)
        body = plan.body
        rounds = 0
        outcome = "ok"
        try:
            while True:
                splitter = EventSplitter(only=None if plan.engine_tools else api.usage_marker)
                end = api.stream_end()
                if not plan.engine_tools:
                    async for chunk in resp.stream():
                        yield chunk  # relayed as it arrives
                        end.feed(chunk)
                        for event in splitter.feed(chunk):
                            tracker.feed(event)
                else:
                    async for chunk in resp.stream():
                        end.feed(chunk)
                        for event in splitter.feed(chunk):
                            tracker.feed(event)
                            shown = tracker.visible(event)
                            if shown:
                                yield shown
                for event in splitter.flush():
                    tracker.feed(event)
                    if plan.engine_tools:
                        shown = tracker.visible(event)
                        if shown:
                            yield shown
                await resp.aclose()
                if not end.complete:  # cut before its last event: the client must not take it as whole
                    outcome = "upstream_error"
                    yield api.stream_failure("the upstream ended the stream before its last event", tracker)
                    break
                if not (plan.engine_tools and tracker.engine_calls_only()):
                    plan.usage = dict(tracker.usage) if tracker.usage else None
                    if plan.engine_tools:
                        await self._answer_beside(plan, [ToolCall(i, n, a) for i, n, a in tracker.calls()])
                    break
                await self._usage(plan, tracker.usage)
                if rounds >= self.settings.max_tool_rounds:
                    yield api.closing(tracker)
                    break
                calls = [ToolCall(i, n, a) for i, n, a in tracker.calls()]
                assistant = tracker.assistant_message()
                results = await anyio.to_thread.run_sync(self._answers, plan, calls, assistant)
                body = api.followup(body, assistant, results)
                self.metrics.tool_rounds.labels(api.name).inc()
                rounds += 1
                resp = await self.client.send("POST", url, headers, encode(body))
                if resp.status >= 400:
                    content = await resp.read()
                    outcome = "upstream_error"
                    yield api.stream_error(resp.status, content, tracker)
                    break
                tracker = api.tracker(plan.engine_tools, first_round=False, previous=tracker)
        except UpstreamError as exc:  # stalled or cut mid-stream: an error event in the API's shape
            outcome = "upstream_error"
            yield api.stream_failure(f"the upstream failed mid-stream: {exc}", tracker)
        finally:
            await resp.aclose()
            self._account(plan, outcome, 200, started)
            # the stream's end goes out in the same step of the event loop, before the work
            # starts; waiting for the response's background would leave a moment (the
            # disconnect watcher stopping) in which the session's next request finds the
            # previous turn's write neither done nor announced
            with contextlib.suppress(RuntimeError):  # no running loop: a generator collected elsewhere
                self._settle_later(plan, plan.usage)
