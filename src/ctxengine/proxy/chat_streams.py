"""The trackers of the chat APIs' streams: OpenAI chat-completions chunks and Anthropic Messages
events (see :mod:`ctxengine.proxy.streams`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ctxengine.proxy.sse import Event, StreamTracker, call_arguments, sse_bytes

__all__ = ["AnthropicStream", "OpenAIStream"]


@dataclass
class OpenAIStream(StreamTracker):
    """Chat-completions chunks: ``choices[0].delta`` pieces, ``finish_reason``, ``usage``."""

    text: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    client_index: dict[int, int] = field(default_factory=dict)
    finish_reason: str | None = None

    def feed(self, event: Event) -> None:
        data = event.data
        if event.done:
            self.finished = True
            return
        if not isinstance(data, dict):
            return
        if isinstance(data.get("usage"), dict):
            self.usage = data["usage"]
        for choice in data.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                self.text.append(delta["content"])
            for tc in delta.get("tool_calls") or []:
                idx = int(tc.get("index", 0))
                slot = self.tool_calls.setdefault(idx, {"id": "", "name": "", "arguments": ""})
                if tc.get("id"):
                    slot["id"] = tc["id"]
                fn = tc.get("function") or {}
                if fn.get("name"):
                    slot["name"] = fn["name"]
                    if fn["name"] not in self.engine_tools:
                        self.client_index[idx] = len(self.client_index)
                if isinstance(fn.get("arguments"), str):
                    slot["arguments"] += fn["arguments"]
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def _is_engine(self, idx: int) -> bool:
        return self.tool_calls.get(idx, {}).get("name") in self.engine_tools

    def engine_calls_only(self) -> bool:
        return bool(self.tool_calls) and all(self._is_engine(i) for i in self.tool_calls)

    def visible(self, event: Event) -> bytes | None:
        if not self.engine_tools:
            return event.raw
        if event.done:
            return None if self.engine_calls_only() else event.raw
        data = event.data
        if not isinstance(data, dict):
            return event.raw
        choices = data.get("choices") or []
        if not choices:  # the usage chunk: shown once the turn is the client's
            return None if self.engine_calls_only() else event.raw
        changed = False
        out_choices = []
        for choice in choices:
            delta = choice.get("delta") or {}
            tcs = delta.get("tool_calls")
            if choice.get("finish_reason") and self.engine_calls_only():
                return None
            if tcs:
                kept = []
                for tc in tcs:
                    idx = int(tc.get("index", 0))
                    if self._is_engine(idx):
                        continue
                    new = self.client_index.get(idx, idx)
                    kept.append(tc if new == idx else {**tc, "index": new})
                if kept != tcs:
                    changed = True
                    delta = {k: v for k, v in delta.items() if k != "tool_calls"}
                    if kept:
                        delta["tool_calls"] = kept
                    if not delta and not choice.get("finish_reason"):
                        continue
                    choice = {**choice, "delta": delta}
            out_choices.append(choice)
        if not changed:
            return event.raw
        if not out_choices:
            return None
        return sse_bytes({**data, "choices": out_choices})

    def calls(self) -> list[tuple[str, str, dict[str, Any]]]:
        return [(c["id"], c["name"], call_arguments(c["arguments"])) for _, c in sorted(self.tool_calls.items())]

    def assistant_message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": "".join(self.text) or None}
        if self.tool_calls:
            msg["tool_calls"] = [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for _, c in sorted(self.tool_calls.items())
            ]
        return msg


@dataclass
class AnthropicStream(StreamTracker):
    """Messages events: ``message_start`` … ``content_block_*`` … ``message_delta``, ``message_stop``.

    ``index_offset``: content blocks the client already saw in earlier rounds (the follow-up
    round's blocks continue the numbering).
    """

    index_offset: int = 0
    blocks: dict[int, dict[str, Any]] = field(default_factory=dict)
    partial: dict[int, list[str]] = field(default_factory=dict)
    client_index: dict[int, int] = field(default_factory=dict)
    stop_reason: str | None = None

    def feed(self, event: Event) -> None:
        data = event.data
        if not isinstance(data, dict):
            return
        kind = data.get("type")
        if kind == "message_start":
            msg = data.get("message") or {}
            if isinstance(msg.get("usage"), dict):
                self.usage = dict(msg["usage"])
        elif kind == "content_block_start":
            idx = int(data.get("index", 0))
            block = dict(data.get("content_block") or {})
            self.blocks[idx] = block
            if not (block.get("type") == "tool_use" and block.get("name") in self.engine_tools):
                self.client_index[idx] = self.index_offset + len(self.client_index)
        elif kind == "content_block_delta":
            idx = int(data.get("index", 0))
            block = self.blocks.setdefault(idx, {"type": "text", "text": ""})
            delta = data.get("delta") or {}
            dtype = delta.get("type")
            if dtype == "text_delta":
                block["text"] = block.get("text", "") + str(delta.get("text", ""))
            elif dtype == "input_json_delta":
                self.partial.setdefault(idx, []).append(str(delta.get("partial_json", "")))
            elif dtype == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + str(delta.get("thinking", ""))
            elif dtype == "signature_delta":
                block["signature"] = block.get("signature", "") + str(delta.get("signature", ""))
            elif dtype == "citations_delta":
                block.setdefault("citations", []).append(delta.get("citation"))
        elif kind == "message_delta":
            delta = data.get("delta") or {}
            if delta.get("stop_reason"):
                self.stop_reason = delta["stop_reason"]
            if isinstance(data.get("usage"), dict):
                self.usage.update({k: v for k, v in data["usage"].items() if v is not None})
        elif kind == "message_stop":
            self.finished = True

    def _is_engine(self, idx: int) -> bool:
        block = self.blocks.get(idx, {})
        return block.get("type") == "tool_use" and block.get("name") in self.engine_tools

    def engine_calls_only(self) -> bool:
        uses = [i for i, b in self.blocks.items() if b.get("type") == "tool_use"]
        return bool(uses) and all(self._is_engine(i) for i in uses)

    @property
    def client_blocks(self) -> int:
        """Content blocks the client has seen so far (this round and the earlier ones)."""
        return self.index_offset + len(self.client_index)

    def visible(self, event: Event) -> bytes | None:
        if not self.engine_tools and self.first_round:
            return event.raw
        data = event.data
        if not isinstance(data, dict):
            return event.raw
        kind = data.get("type")
        if kind == "message_start":
            return event.raw if self.first_round else None
        if kind in ("message_delta", "message_stop"):
            return None if self.engine_calls_only() else event.raw
        if kind in ("content_block_start", "content_block_delta", "content_block_stop"):
            idx = int(data.get("index", 0))
            if self._is_engine(idx):
                return None
            new = self.client_index.get(idx, idx)
            if new == idx:
                return event.raw
            return sse_bytes({**data, "index": new}, str(kind))
        return event.raw

    def calls(self) -> list[tuple[str, str, dict[str, Any]]]:
        out = []
        for idx, block in sorted(self.blocks.items()):
            if block.get("type") == "tool_use":
                raw = "".join(self.partial.get(idx, []))
                args = call_arguments(raw) if raw else dict(block.get("input") or {})
                out.append((str(block.get("id", "")), str(block.get("name", "")), args))
        return out

    def assistant_message(self) -> dict[str, Any]:
        content = []
        for idx, block in sorted(self.blocks.items()):
            b = dict(block)
            if b.get("type") == "tool_use":
                raw = "".join(self.partial.get(idx, []))
                b["input"] = call_arguments(raw) if raw else dict(b.get("input") or {})
            content.append(b)
        return {"role": "assistant", "content": content}
