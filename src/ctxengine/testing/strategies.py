"""Hypothesis strategies for valid conversations, in OpenAI and Anthropic form.

They produce what real agent sessions contain and what engines get wrong: a system prompt or
none, user turns (plain or multimodal), assistant turns with zero to several parallel tool
calls followed by their results, empty and huge contents, CJK and emoji text, paths, URLs and
error lines (the facts the preservation guarantee protects), provider extras and unknown keys,
and tool-call ids reused across groups (real trajectories contain them; providers accept them).

Every conversation drawn from :func:`conversations` passes :func:`ctxengine.messages.validate`
without errors (warnings for reused ids and non-JSON arguments are intended). Payloads from
:func:`anthropic_payloads` are valid Anthropic requests: each ``tool_use`` is answered by a
``tool_result`` in the following user message(s).

Requires ``hypothesis`` (``pip install ctxengine[test]``).
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from hypothesis import strategies as st

from ctxengine.messages import Message

__all__ = [
    "anthropic_payloads",
    "conversations",
    "json_values",
    "texts",
]

_WORDS = (
    "the", "file", "config", "update", "function", "value", "returns", "agent", "context", "session",
    "build", "check", "module", "request", "cache", "token", "window", "summary", "next", "step",
)
_CODE = (
    "def handle(request):", "    return None", "}", "import os", "x = compute(a, b) + 1",
    'raise ValueError("bad input")', "for (int i = 0; i < n; i++) {", "SELECT id FROM users;",
    '{"key": [1, 2, 3]}', "    at com.example.Main.run(Main.java:42)",
)
_PATHS = (
    "src/app/main.py", "/etc/hosts.conf", "tests/test_api.py", "./build/output.log",
    "~/project/README.md", "/usr/lib/jvm", "lib/utils/strings.ts", "../docs/guide.md",
)
_URLS = (
    "https://example.com/docs/api?v=2", "http://localhost:8080/health",
    "https://github.com/org/repo/issues/42", "file:///tmp/report.html",
)
_ERRORS = (
    "Error: file not found", "Traceback (most recent call last):",
    "java.lang.NullPointerException: null", "FAILED tests/test_api.py::test_get - AssertionError",
    "bash: deploy.sh: Permission denied", "fatal: not a git repository",
)
_CJK_EMOJI = (
    "你好，世界", "上下文压缩引擎", "日本語のテキストです", "한국어 문장입니다", "🙂", "🚀🔥", "👩‍💻", "✅ 完成",
    "Ελληνικά", "Привет",
)
_TOOL_NAMES = ("read_file", "bash", "search", "write_file", "get_user_details", "list_dir")
_IMAGE_URLS = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==",
    "https://example.com/screenshot.png",
)

_token = st.one_of(
    st.sampled_from(_WORDS),
    st.sampled_from(_PATHS),
    st.sampled_from(_URLS),
    st.sampled_from(_CJK_EMOJI),
    st.text(max_size=8),
)
_line = st.one_of(
    st.lists(_token, max_size=10).map(" ".join),
    st.sampled_from(_CODE),
    st.sampled_from(_ERRORS),
)


@lru_cache(maxsize=64)
def _int(lo: int, hi: int) -> st.SearchStrategy[int]:
    # strategies are cached: hypothesis computes properties of each new strategy object,
    # which dominated drawing time when composites rebuilt them on every draw
    return st.integers(min_value=lo, max_value=hi)


@lru_cache(maxsize=64)
def texts(*, max_lines: int = 6, huge_tokens: int = 0) -> st.SearchStrategy[str]:
    """Text like agent sessions hold: prose, code, paths, URLs, error lines, CJK and emoji,
    arbitrary unicode; sometimes empty. With ``huge_tokens > 0``, sometimes a numbered listing
    of up to about that many tokens (built by repetition, so drawing it stays cheap)."""
    base = st.lists(_line, max_size=max_lines).map("\n".join)
    if huge_tokens <= 0:
        return base
    return st.one_of(base, _huge_text(huge_tokens))


@lru_cache(maxsize=64)
def _huge_text(huge_tokens: int) -> st.SearchStrategy[str]:
    @st.composite
    def build(draw: st.DrawFn) -> str:
        line = draw(_line)
        target = draw(_int(1, huge_tokens))
        per_line = max(2, (len(line) + 12) // 4)
        n = max(1, target // per_line)
        return "\n".join(f"{i:6d}  {line}" for i in range(1, n + 1))

    return build()


@lru_cache(maxsize=8)
def json_values(max_leaves: int = 6) -> st.SearchStrategy[Any]:
    """JSON values (no NaN or infinities), as tool arguments and inputs carry them."""
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**53), max_value=2**53),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=12),
        st.sampled_from(_PATHS),
    )
    return st.recursive(
        scalars,
        lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
        max_leaves=max_leaves,
    )


@lru_cache(maxsize=8)
def _maybe_text(text: st.SearchStrategy[str]) -> st.SearchStrategy[str | None]:
    return st.sampled_from([None, ""]) | text


def _pick(draw: st.DrawFn, options: tuple[Any, ...] | list[Any]) -> Any:
    """One of ``options`` (shrinks towards the first); cheaper than a new sampled_from."""
    return options[draw(_int(0, len(options) - 1))]


def _shuffle(draw: st.DrawFn, items: list[Any]) -> list[Any]:
    """A permutation of ``items`` (Fisher-Yates; shrinks towards the original order)."""
    out = list(items)
    for i in range(len(out) - 1):
        j = i + draw(_int(0, len(out) - 1 - i))
        out[i], out[j] = out[j], out[i]
    return out


_SHORT_TEXT = st.text(max_size=10)


@lru_cache(maxsize=1)
def _tool_input() -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(st.text(max_size=6), json_values(), max_size=3)


def _rare(draw: st.DrawFn, one_in: int) -> bool:
    return draw(_int(0, one_in - 1)) == 0


def _user_content(draw: st.DrawFn, multimodal: bool, text: st.SearchStrategy[str]) -> Any:
    if multimodal and _rare(draw, 4):
        parts: list[dict[str, Any]] = [{"type": "text", "text": draw(text)}]
        for url in [_pick(draw, _IMAGE_URLS) for _ in range(draw(_int(1, 2)))]:
            parts.append({"type": "image_url", "image_url": {"url": url}})
        if _rare(draw, 3):
            parts[-1]["cache_control"] = {"type": "ephemeral"}
        return _shuffle(draw, parts)
    return draw(text)


@st.composite
def conversations(
    draw: st.DrawFn,
    *,
    min_turns: int = 1,
    max_turns: int = 6,
    max_steps: int = 3,
    max_parallel_calls: int = 3,
    system: bool | None = None,
    multimodal: bool = True,
    huge_tokens: int = 2_000,
    extra_keys: bool = True,
    reuse_ids: bool = True,
    non_json_arguments: bool = True,
) -> list[Message]:
    """A valid OpenAI-format conversation.

    ``min_turns``..``max_turns`` user turns; each is followed by up to ``max_steps`` assistant
    steps with 0..``max_parallel_calls`` parallel tool calls (each answered by one tool message,
    sometimes in another order than the calls), optionally closed by a plain assistant answer.
    ``system``: always (True), never (False) or sometimes (None) a system prompt.
    ``huge_tokens`` bounds the size of the occasional huge tool output (0: none).
    ``extra_keys`` adds provider extras (``reasoning_content``, ``name``) and unknown keys;
    ``reuse_ids`` sometimes reuses a tool-call id of an earlier group; ``non_json_arguments``
    sometimes gives a call non-JSON arguments (allowed, reported as a warning by validate).
    """
    small = texts()
    tool_text = texts(huge_tokens=huge_tokens)
    msgs: list[Message] = []
    if system if system is not None else draw(_int(0, 1)) == 1:
        msgs.append({"role": "system", "content": draw(small)})
    used_ids: list[str] = []
    counter = 0
    for _ in range(draw(_int(min_turns, max_turns))):
        msgs.append(_user_turn(draw, multimodal, small, extra_keys))
        steps = draw(_int(0, max_steps))
        last_had_calls = False
        for _step in range(steps):
            k = draw(_int(0, max_parallel_calls))
            assistant = _assistant_step(draw, k, small, extra_keys)
            calls: list[dict[str, Any]] = []
            group_ids: set[str] = set()
            for _c in range(k):
                reusable = [i for i in used_ids if i not in group_ids]
                if reuse_ids and reusable and _rare(draw, 4):
                    cid = _pick(draw, reusable)
                else:
                    counter += 1
                    cid = f"call_{counter}"
                group_ids.add(cid)
                calls.append(_tool_call(draw, cid, non_json_arguments))
            if calls:
                assistant["tool_calls"] = calls
            msgs.append(assistant)
            msgs.extend(_shuffle(draw, [_tool_result(draw, c, tool_text, multimodal, extra_keys) for c in calls]))
            used_ids.extend(c["id"] for c in calls if c["id"] not in used_ids)
            last_had_calls = bool(calls)
        if last_had_calls and draw(_int(0, 1)) == 1:
            msgs.append({"role": "assistant", "content": draw(small)})
    return msgs


def _user_turn(draw: st.DrawFn, multimodal: bool, small: st.SearchStrategy[str], extra_keys: bool) -> Message:
    """A user message (with ``extra_keys``, sometimes a ``name``)."""
    user: Message = {"role": "user", "content": _user_content(draw, multimodal, small)}
    if extra_keys and _rare(draw, 8):
        user["name"] = "alice"
    return user


def _assistant_step(draw: st.DrawFn, calls: int, small: st.SearchStrategy[str], extra_keys: bool) -> Message:
    """An assistant step before its ``calls`` tool calls: text (maybe none when it calls tools)
    and, with ``extra_keys``, sometimes provider extras."""
    assistant: Message = {"role": "assistant"}
    if calls == 0:
        assistant["content"] = draw(small)
    else:
        assistant["content"] = draw(_maybe_text(small))
    if extra_keys and _rare(draw, 5):
        assistant["reasoning_content"] = draw(small)
    if extra_keys and _rare(draw, 10):
        assistant["x_trace"] = {"span": draw(_int(0, 999))}
    return assistant


def _tool_call(draw: st.DrawFn, cid: str, non_json_arguments: bool) -> dict[str, Any]:
    """One tool call with id ``cid``: a tool name and its arguments (rarely not JSON)."""
    name = _pick(draw, _TOOL_NAMES)
    if non_json_arguments and _rare(draw, 15):
        arguments = "path=" + _pick(draw, _PATHS) + " {unclosed"
    else:
        args = {"path": _pick(draw, _PATHS), "query": draw(_SHORT_TEXT)}
        if _rare(draw, 3):
            args["options"] = draw(json_values())
        arguments = json.dumps(args, ensure_ascii=False)
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}}


def _tool_result(draw: st.DrawFn, call: dict[str, Any], tool_text: st.SearchStrategy[str], multimodal: bool, extra_keys: bool) -> Message:
    """The tool message answering ``call``."""
    content: Any = draw(tool_text)
    if multimodal and _rare(draw, 8):
        content = [{"type": "text", "text": content}]
    result: Message = {"role": "tool", "tool_call_id": call["id"], "content": content}
    if extra_keys and _rare(draw, 3):
        result["name"] = call["function"]["name"]
    return result


# ---------------------------------------------------------------------------------------------
# Anthropic payloads

_CACHE_CONTROLS = ({"type": "ephemeral"}, {"type": "ephemeral", "ttl": "1h"})


def _maybe_cache(draw: st.DrawFn, block: dict[str, Any]) -> dict[str, Any]:
    if _rare(draw, 5):
        block["cache_control"] = dict(_pick(draw, _CACHE_CONTROLS))
    return block


def _a_text_block(draw: st.DrawFn, text: st.SearchStrategy[str]) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": draw(text)}
    if _rare(draw, 12):
        block["citations"] = [{"type": "char_location", "cited_text": "x", "document_index": 0, "start_char_index": 0, "end_char_index": 1}]
    return _maybe_cache(draw, block)


def _a_image_block(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(_int(0, 3))
    source: dict[str, Any]
    if kind == 0:
        source = {"type": "url", "url": _pick(draw, (*_IMAGE_URLS[1:], "https://example.com/a b.jpg"))}
    elif kind == 1:
        source = {"type": "file", "file_id": "file_011CNha8iCJcU1wXNR6q4V8w"}
    else:
        media = _pick(draw, ("image/png", "image/jpeg", "image/gif", "image/webp"))
        source = {"type": "base64", "media_type": media, "data": _pick(draw, ("iVBORw0KGgo=", "/9j/4AAQSkZJRg==", ""))}
    return _maybe_cache(draw, {"type": "image", "source": source})


def _a_other_block(draw: st.DrawFn, text: st.SearchStrategy[str]) -> dict[str, Any]:
    kind = draw(_int(0, 5))
    if kind <= 3:
        return _a_text_block(draw, text)
    if kind == 4:
        return _a_image_block(draw)
    doc = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": draw(text)}, "title": "notes.txt"}
    return _maybe_cache(draw, doc)


def _a_tool_result(draw: st.DrawFn, tool_use_id: str, text: st.SearchStrategy[str]) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_use_id}
    kind = draw(_int(0, 4))
    if kind <= 2:
        block["content"] = draw(text)
    elif kind == 3:
        block["content"] = [
            _a_text_block(draw, text) if draw(_int(0, 3)) else _a_image_block(draw)
            for _ in range(draw(_int(0, 3)))
        ]
    if _rare(draw, 4):
        block["is_error"] = draw(_int(0, 1)) == 1
    return _maybe_cache(draw, block)


def _a_assistant(draw: st.DrawFn, text: st.SearchStrategy[str], counter: list[int]) -> tuple[dict[str, Any], list[str]]:
    if _rare(draw, 6):
        return {"role": "assistant", "content": draw(text)}, []
    blocks: list[dict[str, Any]] = []
    for _ in range(draw(_int(0, 2))):
        if _rare(draw, 3):
            blocks.append({"type": "redacted_thinking", "data": _pick(draw, ("EmwKAhgBEgy3va3pzix/LafPsn4a", "Ep0BCkYIBRgCKkA="))})
        else:
            blocks.append({"type": "thinking", "thinking": draw(text), "signature": _pick(draw, ("ErUBCkYIBRgCIkB", "EqQBCgIYAhIM1gbcDa9GJwZA"))})
    for _ in range(draw(_int(0, 2))):
        blocks.append(_a_text_block(draw, text))
    ids: list[str] = []
    for _ in range(draw(_int(0, 3))):
        counter[0] += 1
        cid = f"toolu_{counter[0]:04d}"
        ids.append(cid)
        blocks.append(_maybe_cache(draw, {"type": "tool_use", "id": cid, "name": _pick(draw, _TOOL_NAMES), "input": draw(_tool_input())}))
    if len(blocks) > 1 and _rare(draw, 3):
        blocks = _shuffle(draw, blocks)
    msg: dict[str, Any] = {"role": "assistant", "content": blocks}
    if _rare(draw, 15):
        msg["x_request_id"] = "req_42"
    return msg, ids


def _a_user_with_results(draw: st.DrawFn, pending: list[str], text: st.SearchStrategy[str]) -> list[dict[str, Any]]:
    results = [_a_tool_result(draw, cid, text) for cid in pending]
    others = [_a_other_block(draw, text) for _ in range(draw(_int(0, 2)))]
    if len(results) > 1 and _rare(draw, 5):
        # the results split over two consecutive user messages
        cut = draw(_int(1, len(results) - 1))
        return [{"role": "user", "content": results[:cut]}, {"role": "user", "content": results[cut:] + others}]
    blocks = results + others
    if _rare(draw, 3):
        blocks = _shuffle(draw, blocks)
    msg: dict[str, Any] = {"role": "user", "content": blocks}
    if _rare(draw, 15):
        msg["x_turn"] = 7
    return [msg]


@st.composite
def anthropic_payloads(draw: st.DrawFn, *, max_turns: int = 5, huge_tokens: int = 0) -> tuple[Any, list[dict[str, Any]]]:
    """A valid Anthropic Messages payload ``(system, messages)``.

    Covers: ``system`` absent, a string, or text blocks with ``cache_control``; user content as
    a string or blocks (text with citations, base64 / URL / file images, documents); assistant
    thinking and redacted_thinking blocks with signatures, text and ``tool_use`` blocks, in the
    usual order or shuffled; ``tool_result`` blocks with string, list or no content and
    ``is_error``, mixed with text and images, sometimes split over two user messages;
    ``cache_control`` on any block; consecutive messages of the same role; unknown keys.
    """
    text = texts(huge_tokens=huge_tokens)
    sys_kind = draw(_int(0, 2))
    system: Any = None
    if sys_kind == 1:
        system = draw(text)
    elif sys_kind == 2:
        system = [_a_text_block(draw, text) for _ in range(draw(_int(0, 3)))]
    messages: list[dict[str, Any]] = []
    pending: list[str] = []
    counter = [0]
    for _ in range(draw(_int(1, max_turns))):
        if pending:
            messages.extend(_a_user_with_results(draw, pending, text))
            pending = []
        elif draw(_int(0, 1)) == 1:
            messages.append({"role": "user", "content": draw(text)})
        else:
            messages.append({"role": "user", "content": [_a_other_block(draw, text) for _ in range(draw(_int(0, 3)))]})
        if _rare(draw, 6):
            messages.append({"role": "user", "content": draw(text)})
        assistant, pending = _a_assistant(draw, text, counter)
        messages.append(assistant)
        if not pending and _rare(draw, 6):
            messages.append({"role": "assistant", "content": [_a_text_block(draw, text)]})
    if pending:
        messages.extend(_a_user_with_results(draw, pending, text))
    return system, messages
