"""Gemini ``contents`` as ctxengine's canonical chat messages and back, losslessly.

A Gemini request carries its conversation as ``systemInstruction`` (a Content) and a list of
*contents* (``{"role": "user" | "model", "parts": [...]}``). :func:`read` turns them into the
OpenAI chat form ctxengine works on (DESIGN §3.1), :func:`write` turns a working context back:

* ``systemInstruction`` → a leading ``system`` message (the text of its parts);
* a ``model`` content → one ``assistant`` message: ``content`` the text of its text parts,
  ``reasoning_content`` the text of its thought parts (``thought: true``), ``tool_calls`` its
  ``functionCall`` parts (id: the call's ``id``, else ``gemini_<content>_<part>``; arguments the
  JSON of ``args``);
* a ``user`` content → one ``tool`` message per ``functionResponse`` part answering a call of
  the model content before it (``content``: the response's one string field, e.g. ``output``,
  else the response's JSON), then its other parts as one ``user`` message (``content``: a string
  for one plain text part, else parts: ``text``, and ``image`` / ``file`` parts standing for
  ``inlineData`` and the like, counted as an image by the window);
* a part with no chat counterpart (a ``functionResponse`` whose call is not in the request,
  ``fileData``, ``executableCode`` …) becomes a text part carrying the part verbatim.

What the canonical fields do not say lives under one private key, ``"gemini"``
(:data:`META_KEY`): the content as it came (on the message made of it, or on the first message
of a ``user`` content split into several), the ``functionResponse`` part of a tool message. A
message whose canonical fields still say what its content says is written back as that content,
byte for byte (thoughts and ``thoughtSignature`` included); a changed one (a cut output, elided
arguments) is rebuilt around what the engine changed: its thought parts and signatures stay,
its text and arguments are the engine's. Messages an engine made are written from their
canonical fields. Two model turns in a row (an engine's note as an assistant message, then a
turn of the client's) are written as one: the API takes a function call turn only right after a
user turn. Nothing here mutates its arguments.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxengine.errors import InputError
from ctxengine.messages import Message

__all__ = ["META_KEY", "History", "Memo", "problem", "read", "response_text", "write"]

META_KEY = "gemini"
_PART = "gemini_part"  # a canonical content part standing for a Gemini part (kept verbatim)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def response_text(response: Any) -> str:
    """The text a ``functionResponse.response`` stands for: its one string field (Gemini CLI
    answers ``{"output": …}`` or ``{"error": …}``), else its JSON."""
    if isinstance(response, Mapping) and len(response) == 1:
        (value,) = response.values()
        if isinstance(value, str):
            return value
    return _dumps(response)


def _response_of(text: Any, original: Any) -> Any:
    """A ``functionResponse.response`` for the (engine-changed) ``text``: in the original's one
    string field, as the JSON object it is, or under ``output``."""
    text = text if isinstance(text, str) else _content_text(text)
    if isinstance(original, Mapping) and len(original) == 1 and isinstance(next(iter(original.values())), str):
        return {next(iter(original)): text}
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"output": text}


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    return ""


# -- parts ------------------------------------------------------------------------------------


def _part_in(part: Any) -> dict[str, Any]:
    """A user content's part as a canonical content part."""
    if isinstance(part, Mapping):
        if part.keys() == {"text"} and isinstance(part["text"], str):
            return {"type": "text", "text": part["text"]}
        data = part.get("inlineData") or part.get("inline_data")
        if isinstance(data, Mapping):
            mime = str(data.get("mimeType") or data.get("mime_type") or "")
            return {"type": "image" if mime.startswith("image/") else "file", _PART: part}
        if isinstance(part.get("text"), str):
            return {"type": "text", "text": part["text"], _PART: part}
    return {"type": "text", "text": _dumps(part), _PART: part}


def _part_out(p: Any) -> Any:
    """A canonical content part as a Gemini part (one standing for a Gemini part: that part,
    unless an engine changed its text)."""
    if not isinstance(p, Mapping):
        return {"text": str(p)}
    original = p.get(_PART)
    if original is not None and _part_in(original) == p:
        return original
    if p.get("type") == "image_url":
        url = p.get("image_url", {}).get("url", "") if isinstance(p.get("image_url"), Mapping) else ""
        if isinstance(url, str) and url.startswith("data:") and ";base64," in url:
            mime, data = url[5:].split(";base64,", 1)
            return {"inlineData": {"mimeType": mime, "data": data}}
    text = p.get("text")
    return {"text": text if isinstance(text, str) else _dumps({k: v for k, v in p.items() if k != _PART})}


def _user_content(parts: Sequence[Any]) -> str | list[dict[str, Any]]:
    canon = [_part_in(p) for p in parts]
    if len(canon) == 1 and canon[0].keys() == {"type", "text"}:
        return str(canon[0]["text"])
    return canon


def _user_parts(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"text": content}]
    if isinstance(content, list):
        return [_part_out(p) for p in content]
    return [{"text": ""}] if content is None else [{"text": _dumps(content)}]


# -- reading ----------------------------------------------------------------------------------


def _model_message(c: Mapping[str, Any], at: int) -> Message:
    """A ``model`` content as an assistant message (see the module docstring)."""
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, part in enumerate(c.get("parts") or []):
        if not isinstance(part, Mapping):
            continue
        fc = part.get("functionCall")
        if isinstance(fc, Mapping):
            cid = fc.get("id") if isinstance(fc.get("id"), str) and fc.get("id") else f"gemini_{at}_{j}"
            calls.append({"id": cid, "type": "function", "function": {"name": str(fc.get("name", "")), "arguments": _dumps(fc.get("args") or {})}})
        elif isinstance(part.get("text"), str):
            (thoughts if part.get("thought") is True else texts).append(part["text"])
    msg: Message = {"role": "assistant", "content": "".join(texts) if texts else None}
    if thoughts:
        msg["reasoning_content"] = "".join(thoughts)
    if calls:
        msg["tool_calls"] = calls
    return msg


def _canonical(m: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in m.items() if k != META_KEY}


def _user_messages(c: Mapping[str, Any], open_calls: dict[str, str]) -> list[Message]:
    """A ``user`` content's messages: a tool message per answered call, then the rest."""
    parts = c.get("parts") or []
    out: list[Message] = []
    rest = []
    for part in parts:
        fr = part.get("functionResponse") if isinstance(part, Mapping) else None
        cid = _answered(fr, open_calls) if isinstance(fr, Mapping) else None
        if cid is None or not isinstance(fr, Mapping):
            rest.append(part)
            continue
        out.append({"role": "tool", "tool_call_id": cid, "content": response_text(fr.get("response")), META_KEY: {"part": part}})
    if rest or not out:
        user: Message = {"role": "user", "content": _user_content(rest)}
        if out:
            user[META_KEY] = {"joins": True}
        out.append(user)
    out[0][META_KEY] = {**out[0].get(META_KEY, {}), "content": c, "count": len(out)}
    return out


def _answered(fr: Mapping[str, Any], open_calls: dict[str, str]) -> str | None:
    """The id of the open call ``fr`` answers (by id, else the first open call of its name),
    taken off ``open_calls``; None when it answers none."""
    fid = fr.get("id")
    if isinstance(fid, str) and fid in open_calls:
        del open_calls[fid]
        return fid
    for cid, name in open_calls.items():
        if name == fr.get("name"):
            del open_calls[cid]
            return cid
    return None


def problem(body: Mapping[str, Any]) -> str | None:
    """What :func:`read` would reject in ``body`` (without converting it), or None."""
    system = body.get("systemInstruction", body.get("system_instruction"))
    if system is not None and not isinstance(system, str | Mapping):
        return f"'systemInstruction' must be a Content object, not {type(system).__name__}"
    for i, c in enumerate(body.get("contents") or []):
        if not isinstance(c, Mapping) or not isinstance(c.get("parts", []), list):
            return f"contents[{i}]: a content must be an object with a 'parts' list"
        if c.get("role", "user") not in ("user", "model"):
            return f"contents[{i}]: role must be 'user' or 'model', not {c.get('role')!r}"
    return None


def _system_message(body: Mapping[str, Any]) -> Message | None:
    system = body.get("systemInstruction", body.get("system_instruction"))
    if system is None:
        return None
    text = system if isinstance(system, str) else _content_text(system.get("parts")) if isinstance(system, Mapping) else None
    if text is None:
        raise InputError(f"'systemInstruction' must be a Content object, not {type(system).__name__}")
    return {"role": "system", "content": text, META_KEY: {"system": system}}


def _read_contents(contents: Sequence[Any], start: int, out: list[Message], ends: list[int]) -> None:
    """Append the messages of ``contents[start:]`` to ``out`` (``contents[start - 1]`` leaves no
    call open), and to ``ends`` how many messages ``out`` holds after each content."""
    open_calls: dict[str, str] = {}
    for i in range(start, len(contents)):
        c = contents[i]
        if not isinstance(c, Mapping) or not isinstance(c.get("parts", []), list):
            raise InputError(f"contents[{i}]: a content must be an object with a 'parts' list")
        if c.get("role") == "model":
            msg = _model_message(c, i)
            msg[META_KEY] = {"content": c, "at": i}
            open_calls = {call["id"]: call["function"]["name"] for call in msg.get("tool_calls", [])}
            out.append(msg)
        elif c.get("role", "user") == "user":
            out += _user_messages(c, open_calls)
            open_calls = {}
        else:
            raise InputError(f"contents[{i}]: role must be 'user' or 'model', not {c.get('role')!r}")
        ends.append(len(out))


def read(body: Mapping[str, Any]) -> list[Message]:
    """``systemInstruction`` and ``contents`` as canonical messages (a new list);
    :class:`InputError` names the first malformed content. (:class:`History` does the same turn
    after turn, converting only the contents a resent history adds.)"""
    system = _system_message(body)
    out: list[Message] = [system] if system is not None else []
    _read_contents(body.get("contents") or [], 0, out, [])
    return out


@dataclass
class History:
    """One session's last request, converted: a client resends its whole history every turn,
    so :meth:`read` converts only the contents after the part it shares with the last request
    (cut back to a content that leaves no call open), and the shared part's messages are the
    same objects as last turn. Results equal :func:`read`'s."""

    contents: list[Any] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)  # of ``contents``, without the system message
    ends: list[int] = field(default_factory=list)  # messages after each content
    system: tuple[Any, Message | None] = (None, None)
    written: Memo = field(default_factory=dict)  # what write() wrote last (its memo)

    def read(self, body: Mapping[str, Any]) -> list[Message]:
        raw_system = body.get("systemInstruction", body.get("system_instruction"))
        if self.system[1] is None or self.system[0] != raw_system:
            self.system = (raw_system, _system_message(body))
        contents = body.get("contents") or []
        prev = self.contents
        k = len(prev) if len(prev) <= len(contents) and prev == contents[: len(prev)] else 0
        if not k:
            for a, b in zip(contents, prev, strict=False):
                if a != b:
                    break
                k += 1
        while k and isinstance(contents[k - 1], Mapping) and contents[k - 1].get("role") == "model":
            k -= 1  # a model turn's calls are answered by the next content: convert from there
        out = self.messages[: self.ends[k - 1]] if k else []
        ends = self.ends[:k]
        _read_contents(contents, k, out, ends)
        self.contents, self.messages, self.ends = list(contents), out, ends
        return [self.system[1], *out] if self.system[1] is not None else list(out)


# -- writing ----------------------------------------------------------------------------------


def _model_out(m: Mapping[str, Any], at: int) -> dict[str, Any]:
    """An assistant message as a ``model`` content: its own content when unchanged, else
    rebuilt around the engine's changes (thoughts and signatures kept)."""
    meta = m.get(META_KEY)
    original = meta.get("content") if isinstance(meta, Mapping) else None
    origin = meta.get("at", at) if isinstance(meta, Mapping) else at
    if isinstance(original, Mapping) and _model_message(original, origin) == _canonical(m):
        return original  # type: ignore[return-value]
    calls = {c.get("id"): c for c in m.get("tool_calls") or [] if isinstance(c, Mapping)}
    derived = _model_message(original, origin) if isinstance(original, Mapping) else {}
    keep_thoughts = derived.get("reasoning_content") == m.get("reasoning_content")
    parts: list[Any] = []
    text_done = False
    for j, part in enumerate((original or {}).get("parts") or []):
        fc = part.get("functionCall") if isinstance(part, Mapping) else None
        if isinstance(fc, Mapping):
            cid = fc.get("id") if isinstance(fc.get("id"), str) and fc.get("id") else f"gemini_{origin}_{j}"
            call = calls.pop(cid, None)
            if call is not None:
                parts.append(_call_part(call, part))
        elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
            if part.get("thought") is True:
                if keep_thoughts:
                    parts.append(part)
            elif not text_done:
                text_done = True
                if m.get("content"):
                    parts.append({**part, "text": _content_text(m["content"])})
        else:
            parts.append(part)
    if not text_done and m.get("content"):
        parts.insert(sum(1 for p in parts if isinstance(p, Mapping) and p.get("thought") is True), {"text": _content_text(m["content"])})
    parts += [_call_part(c, None) for c in calls.values()]
    shell = dict(original) if isinstance(original, Mapping) else {"role": "model"}
    shell["parts"] = parts or [{"text": ""}]
    return shell


def _call_part(call: Mapping[str, Any], original: Any) -> dict[str, Any]:
    fn = call.get("function") or {}
    raw = fn.get("arguments")
    try:
        args = json.loads(raw) if isinstance(raw, str) and raw.strip() else raw or {}
    except ValueError:
        args = {"input": raw}
    if not isinstance(args, dict):
        args = {"input": args}
    if isinstance(original, Mapping):
        fc = dict(original["functionCall"])
        fc["args"] = args
        return {**original, "functionCall": fc}
    fc = {"name": str(fn.get("name", "")), "args": args}
    cid = call.get("id")
    if isinstance(cid, str) and cid and not cid.startswith("gemini_"):
        fc["id"] = cid
    return {"functionCall": fc}


def _response_part(m: Mapping[str, Any], names: Mapping[str, str]) -> Any:
    meta = m.get(META_KEY)
    part = meta.get("part") if isinstance(meta, Mapping) else None
    if isinstance(part, Mapping):
        fr = part["functionResponse"]
        if response_text(fr.get("response")) == m.get("content"):
            return part
        return {**part, "functionResponse": {**fr, "response": _response_of(m.get("content"), fr.get("response"))}}
    cid = str(m.get("tool_call_id", ""))
    fr = {"name": names.get(cid, ""), "response": _response_of(m.get("content"), None)}
    if cid and not cid.startswith("gemini_"):
        fr["id"] = cid
    return {"functionResponse": fr}


def _group_out(group: Sequence[Mapping[str, Any]], names: Mapping[str, str]) -> dict[str, Any]:
    """A run of tool messages (and the user message joining them) as one ``user`` content: the
    content they came from when none changed, else rebuilt."""
    meta = group[0].get(META_KEY)
    original = meta.get("content") if isinstance(meta, Mapping) else None
    if isinstance(meta, Mapping) and isinstance(original, Mapping) and meta.get("count") == len(group):
        again = _user_messages(original, {str(m.get("tool_call_id")): names.get(str(m.get("tool_call_id")), "") for m in group if m.get("role") == "tool"})
        if [_canonical(a) for a in again] == [_canonical(m) for m in group]:
            return original  # type: ignore[return-value]
    parts: list[Any] = []
    for m in group:
        parts += [_response_part(m, names)] if m.get("role") == "tool" else _user_parts(m.get("content"))
    shell = {k: v for k, v in original.items()} if isinstance(original, Mapping) else {"role": "user"}
    shell["parts"] = parts
    return shell


Memo = dict[tuple[int, ...], tuple[tuple[Message, ...], Any]]
"""What :func:`write` wrote last, by the ids of the messages a content came from (the messages
kept, so their ids stay theirs)."""


def write(body: Mapping[str, Any], messages: Sequence[Message], memo: Memo | None = None) -> dict[str, Any]:
    """``body`` with ``messages`` as its ``systemInstruction`` and ``contents`` (every other key
    untouched). ``memo`` (a session's, :attr:`History.written`): a content written last time
    from the very same messages is reused, not built again."""
    out = dict(body)
    sys_key = "system_instruction" if "system_instruction" in body and "systemInstruction" not in body else "systemInstruction"
    contents: list[Any] = []
    names: dict[str, str] = {}
    fresh: Memo = {}

    def cached(group: Sequence[Message], make: Any) -> Any:
        key = tuple(id(m) for m in group)
        hit = memo.get(key) if memo is not None else None
        value = hit[1] if hit is not None and all(a is b for a, b in zip(hit[0], group, strict=True)) else make()
        fresh[key] = (tuple(group), value)
        return value

    i, n = 0, len(messages)
    if n and messages[0].get("role") in ("system", "developer"):
        out[sys_key] = _system_out(messages[0])  # in its place when the body had one
        i = 1
    else:
        out.pop(sys_key, None)
    while i < n:
        m = messages[i]
        role = m.get("role")
        if role == "assistant":
            for c in m.get("tool_calls") or []:
                if isinstance(c, Mapping):
                    names[str(c.get("id"))] = str((c.get("function") or {}).get("name", ""))
            at = len(contents)
            model = cached([m], lambda m=m, at=at: _model_out(m, at))
            if contents and contents[-1].get("role") == "model":  # after an engine's note: one model turn
                before = contents.pop()
                model = {**before, "parts": [*before.get("parts", []), *model.get("parts", [])]}
            contents.append(model)
            i += 1
            continue
        j = i + 1
        if role == "tool":
            while j < n and messages[j].get("role") == "tool" and not _starts_content(messages[j]):
                j += 1
            if j < n and messages[j].get("role") == "user" and (messages[j].get(META_KEY) or {}).get("joins"):
                j += 1
        elif not (role == "user" and isinstance(m.get(META_KEY), Mapping)):
            contents.append({"role": "user", "parts": _user_parts(m.get("content"))})  # an engine's message
            i += 1
            continue
        group = messages[i:j]
        if all(g.get("role") != "tool" or isinstance(g.get(META_KEY), Mapping) for g in group):
            contents.append(cached(group, lambda group=group: _group_out(group, names)))
        else:  # an answer the proxy or an engine wrote: its call's name is looked up
            contents.append(_group_out(group, names))
        i = j
    out["contents"] = contents
    if memo is not None:
        memo.clear()
        memo.update(fresh)
    return out


def _starts_content(m: Mapping[str, Any]) -> bool:
    meta = m.get(META_KEY)
    return isinstance(meta, Mapping) and "content" in meta


def _system_out(m: Mapping[str, Any]) -> Any:
    meta = m.get(META_KEY)
    original = meta.get("system") if isinstance(meta, Mapping) else None
    text = _content_text(m.get("content"))
    if original is not None:
        if isinstance(original, str):
            return original if original == text else {"parts": [{"text": text}]}
        if _content_text(original.get("parts")) == text:
            return original
        return {**original, "parts": [{"text": text}]}
    return {"parts": [{"text": text}]}
