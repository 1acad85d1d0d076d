"""What each provider rejects, checked as the provider checks it: a tool call without its
result or a result without its call, a thinking block whose signature this server did not
issue, a Responses reasoning item altered or missing. Each check returns (reason, the
provider's message) of a rejection, or None."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Rejection = tuple[str, str]


def reasoning_summary(rid: str) -> str:
    """The summary text this server issues with the reasoning item ``rid``."""
    return f"Planning the next read ({rid[-6:]})."


def validate_chat(messages: list[Any]) -> Rejection | None:
    pending: list[str] = []
    known: set[str] = set()
    for m in messages:
        role = m.get("role") if isinstance(m, dict) else None
        if role == "tool":
            tid = m.get("tool_call_id")
            if tid not in known:
                return (
                    "result_without_call",
                    "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.",
                )
            if tid in pending:
                pending.remove(tid)
            continue
        if pending:
            return (
                "call_without_result",
                "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. "
                f"The following tool_call_ids did not have response messages: {', '.join(pending)}",
            )
        if role == "assistant":
            for c in m.get("tool_calls") or []:
                pending.append(c.get("id"))
                known.add(c.get("id"))
    if pending:
        return (
            "call_without_result",
            "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. "
            f"The following tool_call_ids did not have response messages: {', '.join(pending)}",
        )
    return None


def thinking_enabled(body: Mapping[str, Any]) -> bool:
    """Whether an Anthropic request turns extended thinking on."""
    thinking = body.get("thinking")
    return isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")


def validate_messages(body: dict[str, Any], sign: Callable[[str], str]) -> Rejection | None:
    """Anthropic Messages: tool_use/tool_result pairs, thinking signatures, and (thinking on) a
    running tool loop whose assistant turn starts with its thinking block."""
    messages = body.get("messages") or []
    prev_uses: list[str] = []
    for idx, m in enumerate(messages):
        content = m.get("content")
        blocks = content if isinstance(content, list) else []
        if m.get("role") == "user":
            bad = _user_results(idx, blocks, prev_uses)
            if bad is not None:
                return bad
            prev_uses = []
        elif m.get("role") == "assistant":
            if prev_uses:
                return (
                    "call_without_result",
                    f"messages.{idx}: `tool_use` ids were found without `tool_result` blocks immediately after: {', '.join(prev_uses)}.",
                )
            prev_uses = [
                str(b.get("id"))
                for b in blocks
                if isinstance(b, dict) and b.get("type") == "tool_use"
            ]
            bad = _signatures(idx, blocks, sign)
            if bad is not None:
                return bad
    if prev_uses:
        return (
            "call_without_result",
            f"`tool_use` ids were found without `tool_result` blocks immediately after: {', '.join(prev_uses)}.",
        )
    if thinking_enabled(body) and messages:
        return _thinking_first(messages)
    return None


def _user_results(idx: int, blocks: list[Any], prev_uses: list[str]) -> Rejection | None:
    results = [
        b.get("tool_use_id")
        for b in blocks
        if isinstance(b, dict) and b.get("type") == "tool_result"
    ]
    for r in results:
        if r not in prev_uses:
            return (
                "result_without_call",
                f"messages.{idx}.content.0: unexpected `tool_use_id` found in `tool_result` blocks: {r}. "
                "Each `tool_result` block must have a corresponding `tool_use` block in the previous message.",
            )
    missing = [u for u in prev_uses if u not in results]
    if missing:
        return (
            "call_without_result",
            f"messages.{idx}: `tool_use` ids were found without `tool_result` blocks immediately after: {', '.join(missing)}. "
            "Each `tool_use` block must have a corresponding `tool_result` block in the next message.",
        )
    return None


def _signatures(idx: int, blocks: list[Any], sign: Callable[[str], str]) -> Rejection | None:
    for j, b in enumerate(blocks):
        if (
            isinstance(b, dict)
            and b.get("type") == "thinking"
            and b.get("signature") != sign(str(b.get("thinking", "")))
        ):
            return (
                "bad_thinking_signature",
                f"messages.{idx}.content.{j}: Invalid `signature` in `thinking` block",
            )
        if isinstance(b, dict) and b.get("type") == "redacted_thinking":
            return (
                "bad_thinking_signature",
                f"messages.{idx}.content.{j}: Invalid `data` in `redacted_thinking` block",
            )
    return None


def _thinking_first(messages: list[Any]) -> Rejection | None:
    """The assistant turn of a running tool loop must start with its thinking block."""
    last_user = messages[-1]
    ends_in_results = isinstance(last_user.get("content"), list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in last_user["content"]
    )
    if not (ends_in_results and len(messages) >= 2):
        return None
    prev = messages[-2]
    blocks = prev.get("content") if isinstance(prev.get("content"), list) else []
    issued = any(
        isinstance(b, dict)
        and b.get("type") == "tool_use"
        and str(b.get("id", "")).startswith("toolu_strict")
        for b in blocks
    )
    if issued and not (
        blocks
        and isinstance(blocks[0], dict)
        and blocks[0].get("type") in ("thinking", "redacted_thinking")
    ):
        return (
            "thinking_missing",
            f"messages.{len(messages) - 2}.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{blocks[0].get('type') if blocks else 'text'}`. "
            "When `thinking` is enabled, a final `assistant` message must start with a thinking block.",
        )
    return None


def validate_responses(
    items: Any, reasoning: Mapping[str, str], call_reasoning: Mapping[str, str]
) -> Rejection | None:
    """Responses: outputs without their call, reasoning items altered (``reasoning``: id → the
    encrypted_content issued), calls sent without the reasoning item issued before them."""
    if not isinstance(items, list):
        return None
    calls: set[str] = set()
    seen_reasoning: set[str] = set()
    for it in items:
        if not isinstance(it, dict):
            continue
        kind = it.get("type")
        if kind == "reasoning":
            rid = str(it.get("id", ""))
            if rid in reasoning:
                bad = _reasoning_altered(it, rid, reasoning[rid])
                if bad is not None:
                    return bad
            seen_reasoning.add(rid)
        elif kind in ("function_call", "local_shell_call", "custom_tool_call"):
            calls.add(str(it.get("call_id")))
            fid = str(it.get("id", ""))
            need = call_reasoning.get(fid)
            if need and need not in seen_reasoning:
                return (
                    "reasoning_missing",
                    f"Item '{fid}' of type '{kind}' was provided without its required 'reasoning' item: '{need}'.",
                )
        elif kind in ("function_call_output", "local_shell_call_output", "custom_tool_call_output"):
            cid = str(it.get("call_id"))
            if cid not in calls:
                return (
                    "result_without_call",
                    f"No tool call found for function call output with call_id {cid}.",
                )
    return None


def _reasoning_altered(it: dict[str, Any], rid: str, issued: str) -> Rejection | None:
    if it.get("encrypted_content") is not None and it.get("encrypted_content") != issued:
        return ("reasoning_altered", f"The encrypted content for item {rid} could not be verified.")
    if it.get("summary") not in (
        None,
        [],
        [{"type": "summary_text", "text": reasoning_summary(rid)}],
    ):
        return ("reasoning_altered", f"Item '{rid}' of type 'reasoning' was modified.")
    return None
