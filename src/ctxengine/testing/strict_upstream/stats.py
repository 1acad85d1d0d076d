"""The server's counters (``StrictUpstream.stats``) and how each request moves them."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any


def new_stats() -> dict[str, Any]:
    return {
        "requests": 0,
        "chat_requests": 0,
        "rejected": Counter(),
        "over_window": 0,
        "max_tokens_seen": 0,
        "input_tokens": 0,
        "steps_seen": set(),
        "recall_calls": 0,
        "recall_answered": 0,
        "client_compactions": 0,
        "reread": None,  # the re-read scenario: {"answer": the client's tool result, "in_view": bool}
        "finished": False,
        "paths": Counter(),
    }


def note_request(stats: dict[str, Any], path: str) -> None:
    """A request on one of the three APIs (count_tokens and unknown paths are not counted)."""
    stats["requests"] += 1
    stats["paths"][path] += 1


def note_rejection(stats: dict[str, Any], reason: str) -> None:
    stats["rejected"][reason] += 1
    if reason == "over_window":
        stats["over_window"] += 1


def note_answered(stats: dict[str, Any], body: dict[str, Any], tokens: int) -> None:
    """A request answered 200: a task request adds its tokens; every one may raise the peak."""
    if "BENCH-TASK" in json.dumps(body.get("messages") or body.get("input") or ""):
        stats["chat_requests"] += 1
        stats["input_tokens"] += tokens
    stats["max_tokens_seen"] = max(stats["max_tokens_seen"], tokens)
