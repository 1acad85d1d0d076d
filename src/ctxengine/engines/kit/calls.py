"""Tool calls in records: a short preview of a call, and over-long arguments elided.

A record that replaces a tool result names the call it answers, ``read_file("config.yaml")``
(:func:`call_preview`); an assistant message whose call arguments are longer than an engine
allows keeps a small JSON object in their place, ``{"_ctxengine_elided_chars": N, "head": "…",
"facts": "…"}`` (:func:`elide_args`): still valid JSON, still the same calls, the paths and URLs
of what was removed listed verbatim.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ctxengine.engines.kit.blocks import render_facts, unseen
from ctxengine.facts import Facts, paths_in, urls_in
from ctxengine.messages import Message, tool_call_args, tool_call_name

__all__ = ["ARGS_HEAD", "CALL_PREVIEW", "ELIDED_KEY", "call_preview", "elide_args"]

ELIDED_KEY = "_ctxengine_elided_chars"
"""Key of the JSON object that replaces over-long tool-call arguments."""
ARGS_HEAD = 160
"""Characters of the arguments an elided call keeps."""
CALL_PREVIEW = 60
"""Characters of a call's first argument a preview shows."""


def call_preview(call: Mapping[str, Any] | None) -> str:
    """``name("first argument")``, the first argument cut to CALL_PREVIEW characters."""
    if call is None:
        return "tool"
    args = tool_call_args(call)
    if isinstance(args, dict):
        first: Any = args.get("head", "") if ELIDED_KEY in args else next(iter(args.values()), "") if args else ""
        more = len(args) > 1 and ELIDED_KEY not in args
    else:
        first, more = args, False
    if not isinstance(first, str):
        first = json.dumps(first, ensure_ascii=False, sort_keys=True)
    if len(first) > CALL_PREVIEW:
        first = first[:CALL_PREVIEW] + "…"
    shown = json.dumps(first, ensure_ascii=False) if first or args else ""
    return f"{tool_call_name(call)}({shown}{', …' if more else ''})"


def elide_args(message: Message, max_chars: int) -> Message | None:
    """``message`` with call arguments longer than ``max_chars`` elided (see the module
    docstring), or ``None`` when no call gets shorter."""
    raw = message.get("tool_calls")
    if not isinstance(raw, list):
        return None
    changed = False
    calls: list[Any] = []
    for c in raw:
        fn = c.get("function") if isinstance(c, dict) else None
        args = fn.get("arguments") if isinstance(fn, dict) else None
        if not isinstance(fn, dict) or not isinstance(args, str) or len(args) <= max_chars or args.startswith('{"' + ELIDED_KEY):
            calls.append(c)
            continue
        kept: dict[str, Any] = {ELIDED_KEY: len(args), "head": args[:ARGS_HEAD]}
        missing = unseen(Facts([], paths_in(args), urls_in(args), [], []), json.dumps(kept, ensure_ascii=False))
        if len(missing):
            kept["facts"] = "\n".join(render_facts(missing))
        new_args = json.dumps(kept, ensure_ascii=False)
        if len(new_args) >= len(args):
            calls.append(c)
            continue
        calls.append({**c, "function": {**fn, "arguments": new_args}})
        changed = True
    return {**message, "tool_calls": calls} if changed else None
