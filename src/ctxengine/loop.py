"""The one agent loop: how every caller asks an engine to compact, and how a recorded session is
replayed as an agent would live it.

Four places drive engines — :class:`ctxengine.ContextManager` (every turn), ``ctxengine bench``
(replays), the contract kit and ``ctxengine compact`` — and they all go through this module, so
the trigger and the calling convention are written once:

* :func:`should_compact` — the engine's trigger: ``should_compress(tokens)`` or
  ``should_compress_preflight(messages)``;
* :func:`run_compress` — one ``compress`` call, isolated from the host: the engine gets a deep
  copy (the caller's data is never touched, whatever the engine does), the call runs under a
  deadline on a worker thread (a late result is discarded), anything it raises — ``SystemExit``
  included — becomes :class:`~ctxengine.errors.EngineError` naming the engine and where it
  comes from, and an engine that edits the copy it was given is reported (rule 2). Seed-era
  engines whose ``compress`` takes no ``focus_topic`` are called without it (the registry reads
  that once per engine class: :func:`ctxengine.registry.compress_takes_focus`; a ``TypeError``
  raised inside ``compress`` is the engine's failure, never a cue to retry);
* :func:`check_output` — what ``compress`` returned keeps the contract's rules 1 and 5;
* :func:`replay` — a recorded session as an agent loop: before each recorded assistant message
  the working context goes through ``prepare`` (a manager's, usually); the recorded assistant
  message and what followed it are appended to what was sent.
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ctxengine.engine import ContextEngine
from ctxengine.errors import EngineError
from ctxengine.messages import Message, content_text, is_summary, validate
from ctxengine.registry import compress_takes_focus
from ctxengine.workers import Running, call_within

__all__ = [
    "CompressOutcome",
    "check_output",
    "engine_busy",
    "engine_label",
    "fingerprint",
    "recorded_turns",
    "replay",
    "run_compress",
    "should_compact",
]


def engine_label(engine: ContextEngine) -> str:
    """``'name'`` or ``'name' (plugin <source>)`` for messages that must name the culprit."""
    try:
        name = str(engine.name)
    except Exception:  # a broken name property must not hide the real error
        name = type(engine).__name__
    source = getattr(engine, "_ctxengine_source", None)
    return f"{name!r} (from {source})" if source else repr(name)


def fingerprint(messages: Sequence[Message]) -> str:
    """A digest of ``messages`` (JSON, sorted keys): equal lists give equal digests."""
    raw = json.dumps(list(messages), sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.blake2b(raw.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def should_compact(engine: ContextEngine, tokens: int, messages: list[Message]) -> bool:
    """The engine's trigger (the one used everywhere): ``should_compress(tokens)`` or
    ``should_compress_preflight(messages)``. A trigger that raises is the engine's failure."""
    try:
        return bool(engine.should_compress(tokens)) or bool(
            engine.should_compress_preflight(messages)
        )
    except Exception as exc:
        raise EngineError(
            f"engine {engine_label(engine)} failed in should_compress: {type(exc).__name__}: {exc}"
        ) from exc


_WORKERS: weakref.WeakKeyDictionary[ContextEngine, Running] = weakref.WeakKeyDictionary()
"""The worker of each engine's last compress that ran past its deadline."""


def engine_busy(engine: ContextEngine) -> bool:
    """True while a compress of ``engine`` that ran past its deadline is still running."""
    worker = _WORKERS.get(engine)
    return worker is not None and worker.is_alive()


@dataclass(slots=True)
class CompressOutcome:
    """What one isolated ``compress`` call gave: the output and how long it took."""

    output: list[Message]
    elapsed_ms: float
    changed_input: bool = False


_ATOMIC = (str, int, float, bool, type(None))


def _copy_value(value: Any) -> Any:
    """A deep copy of a message value: dicts, lists and atoms (what JSON holds) copied directly,
    several times faster than :func:`copy.deepcopy`; anything else (subclasses included) by
    ``deepcopy``. (Two places holding one object get one copy each: nothing an engine may
    rely on.)"""
    if type(value) is dict:
        return {k: v if type(v) in _ATOMIC else _copy_value(v) for k, v in value.items()}
    if type(value) is list:
        return [v if type(v) in _ATOMIC else _copy_value(v) for v in value]
    if type(value) in _ATOMIC:
        return value
    return copy.deepcopy(value)


def _edited(given: list[Message], original: list[Message]) -> bool:
    """Whether the engine edited ``given``, its deep copy of ``original`` (which it never
    saw): one C-level comparison of the values when they are equal (the common case), the
    fingerprints otherwise (what JSON shows: a value that compares unequal only as an object,
    never serialised differently, is no edit)."""
    try:
        if given == original:
            return False
    except Exception:  # a value whose comparison fails: the fingerprints decide
        pass
    return fingerprint(given) != fingerprint(original)


def _raise_failure(engine: ContextEngine, exc: BaseException | None) -> None:
    """What ``compress`` raised (``exc``), as :class:`EngineError` naming the engine; a
    ``KeyboardInterrupt`` as itself (the person at the keyboard, not the engine)."""
    if exc is not None:
        if isinstance(exc, KeyboardInterrupt):
            raise exc
        raise EngineError(
            f"engine {engine_label(engine)} failed in compress: {type(exc).__name__}: {exc}"
        ) from exc


def run_compress(
    engine: ContextEngine,
    messages: Sequence[Message],
    *,
    tokens: int | None = None,
    focus_topic: str | None = None,
    deadline: float | None = None,
    copy_input: bool = True,
) -> CompressOutcome:
    """Call ``engine.compress`` isolated from the host (see the module docstring).

    ``deadline`` (seconds, ``None`` for none) bounds the call; on expiry :class:`EngineError`
    is raised at once and the worker's eventual result is discarded. ``copy_input=False``
    (the contract kit, which checks mutation itself) hands the engine ``messages`` itself.
    """
    if engine_busy(engine):
        raise EngineError(
            f"engine {engine_label(engine)} is still running a compress that missed its deadline; not called again until it returns"
        )
    original = list(messages)
    given: list[Message] = [_copy_value(m) for m in original] if copy_input else messages  # type: ignore[assignment]
    kwargs: dict[str, Any] = {"current_tokens": tokens}
    if focus_topic is not None and compress_takes_focus(type(engine)):
        kwargs["focus_topic"] = focus_topic
    box: dict[str, Any] = {}

    def call() -> None:
        try:
            box["out"] = engine.compress(given, **kwargs)
        except BaseException as exc:  # SystemExit from a plugin must not end the host
            box["exc"] = exc

    t0 = time.perf_counter()
    if deadline is None:
        call()
    else:
        worker = call_within(call, deadline, name=f"ctxengine-compress-{engine_label(engine)}")
        if worker.is_alive():
            _WORKERS[engine] = worker
            raise EngineError(
                f"engine {engine_label(engine)} did not return from compress within {deadline:g} s (context.engine_timeout); its late result will be discarded"
            )
    elapsed = (time.perf_counter() - t0) * 1000.0
    _raise_failure(engine, box.get("exc"))
    out = box.get("out")
    changed = copy_input and _edited(given, original)
    if not isinstance(out, list) or not all(isinstance(m, dict) for m in out):
        raise EngineError(
            f"engine {engine_label(engine)} broke rule 1 (valid in, valid out): compress returned {type(out).__name__}, not a list of message dicts"
        )
    if changed:
        raise EngineError(
            f"engine {engine_label(engine)} broke rule 2 (no mutation of the input): compress edited the messages it was given"
        )
    return CompressOutcome(_given_back(out, given, original) if copy_input else out, elapsed, changed)


def _given_back(out: list[Message], given: list[Message], original: list[Message]) -> list[Message]:
    """``out`` with each message the engine returned as it got it (its copy, checked unedited)
    replaced by the caller's own, equal one: the host's memos by message object (the session's
    token counts, the store's recorded chain and serialisations) keep hitting after a
    compaction instead of counting, serialising and hashing every kept message again."""
    back = {id(g): o for g, o in zip(given, original, strict=True)}
    return [back.get(id(m), m) for m in out]


def check_output(engine: ContextEngine, before: Sequence[Message], out: Sequence[Message]) -> None:
    """Raise :class:`EngineError` naming the broken rule when ``out`` is not a valid chat
    (rule 1) or lost an anchor (rule 5: the system prompt first, the latest user message
    verbatim — an engine's own user-role summary is not the user's latest message)."""
    label = engine_label(engine)
    errors = validate(list(out), allow_pending_calls=True, errors_only=True)
    if errors:
        shown = "; ".join(str(v) for v in errors[:3])
        raise EngineError(
            f"engine {label} broke rule 1 (valid in, valid out): {len(errors)} violation(s): {shown}"
        )
    if before and before[0].get("role") == "system" and (not out or out[0].get("role") != "system"):
        raise EngineError(
            f"engine {label} broke rule 5 (anchors survive): the system prompt is no longer first"
        )
    last_user = next(
        (m for m in reversed(before) if m.get("role") == "user" and not is_summary(m)), None
    )
    if last_user is not None:
        text = content_text(last_user.get("content"))
        if not any(m.get("role") == "user" and content_text(m.get("content")) == text for m in out):
            raise EngineError(
                f"engine {label} broke rule 5 (anchors survive): the latest user message was not kept verbatim"
            )


def recorded_turns(messages: Sequence[Message]) -> tuple[list[Message], list[list[Message]]]:
    """Split a recorded session into what precedes the first assistant message and, for each
    assistant message, that message and everything up to the next one (what the agent appends
    after each request)."""
    msgs = list(messages)
    first = next((i for i, m in enumerate(msgs) if m.get("role") == "assistant"), len(msgs))
    chunks: list[list[Message]] = []
    i = first
    while i < len(msgs):
        j = i + 1
        while j < len(msgs) and msgs[j].get("role") != "assistant":
            j += 1
        chunks.append(msgs[i:j])
        i = j
    return msgs[:first], chunks


Prepare = Callable[[list[Message]], list[Message]]
AfterRequest = Callable[[int, list[Message], list[Message]], None]


def replay(
    messages: Sequence[Message], prepare: Prepare, after: AfterRequest | None = None
) -> tuple[list[Message], list[Message]]:
    """Replay a recorded session as an agent loop; returns ``(last request, final history)``.

    Before every recorded assistant message the working context goes through ``prepare``
    (compaction, the window cap); ``after(call_index, request, appended)`` sees each request
    and the recorded messages about to be appended (measure it, report usage there).
    """
    working, chunks = recorded_turns(messages)
    last: list[Message] = working
    for k, chunk in enumerate(chunks):
        working = prepare(working)
        if after is not None:
            after(k, working, chunk)
        last = working
        working = [*working, *chunk]
    return last, working
