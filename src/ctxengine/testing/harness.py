"""The harness of the engine contract kit: makes engines, checks every ``compress`` call against
the invariants of DESIGN §3.3, replays conversations as an agent loop and through a
ContextManager, and keeps the report (see :mod:`ctxengine.testing.contract`)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from ctxengine.config import Config
from ctxengine.engine import ContextEngine
from ctxengine.errors import ContextWindowError, EngineError
from ctxengine.facts import FACT_KINDS, context_text, extract_facts, missing_facts
from ctxengine.loop import recorded_turns, replay, run_compress, should_compact
from ctxengine.manager import MAX_CONSECUTIVE_COMPACTIONS
from ctxengine.messages import (
    Message,
    content_text,
    is_summary,
    message_text,
    tool_call_id,
    tool_call_name,
    tool_calls,
    validate,
)
from ctxengine.testing.contract_report import (
    MAX_ANNOTATION_CHARS,
    ContractReport,
    ContractViolation,
    EngineSource,
    show_messages,
)
from ctxengine.tokens import estimate, estimate_messages_tokens

__all__ = ["Harness", "giant_output_session"]


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=repr)


def _is_fold(message: Message) -> bool:
    """A marked summary standing for a span (tool-result records stand for one output only)."""
    return message.get("role") != "tool" and is_summary(message)


def _is_annotation(line: str) -> bool:
    s = line.strip()
    return s.startswith("[") and s.endswith("]") and len(s) <= MAX_ANNOTATION_CHARS


class Harness:
    """Makes engines, checks each call, and keeps the report."""

    def __init__(self, source: EngineSource) -> None:
        if isinstance(source, ContextEngine):
            self._instance: ContextEngine | None = source
            self._factory: Callable[[], ContextEngine] | None = None
        elif callable(source):
            self._instance = None
            self._factory = source
        else:
            raise TypeError(f"check_engine_contract needs a ContextEngine or a factory returning one, not {type(source).__name__}")
        self._sessions = 0
        probe = self._make()
        self.name = str(probe.name)
        self.deterministic = bool(probe.deterministic)
        self.threshold = int(probe.threshold_tokens)
        self.context_length = int(probe.context_length)
        self.report = ContractReport(self.name, self.deterministic)

    def _make(self) -> ContextEngine:
        if self._factory is not None:
            engine = self._factory()
            if not isinstance(engine, ContextEngine):
                raise TypeError(f"the engine factory returned a {type(engine).__name__}, not a ContextEngine")
            return engine
        assert self._instance is not None
        self._instance.on_session_reset()
        return self._instance

    def fresh(self) -> tuple[ContextEngine, str]:
        engine = self._make()
        self._sessions += 1
        session_id = f"contract-{self._sessions}"
        engine.on_session_start(session_id)
        return engine, session_id

    def fail(self, invariant: int, detail: str, example: Sequence[Message], where: str = "") -> ContractViolation:
        return ContractViolation(invariant, self.name, detail, example, where)

    def count(self, *invariants: int) -> None:
        for n in invariants:
            self.report.checks[n] += 1

    # -- one compress call ----------------------------------------------------------------------
    def compress(self, engine: ContextEngine, messages: list[Message], tokens: int, where: str) -> list[Message]:
        before = _dumps(messages)
        self.report.compress_calls += 1
        try:
            out: Any = run_compress(engine, messages, tokens=tokens, copy_input=False).output
        except EngineError as exc:
            if _dumps(messages) != before:
                raise self.fail(2, f"compress changed its input: {exc}", json.loads(before), where) from exc
            raise self.fail(1, f"compress failed: {exc}", messages, where) from exc
        self.count(2)
        if _dumps(messages) != before:
            old = json.loads(before)
            idx = next((i for i, (a, b) in enumerate(zip(old, messages, strict=False)) if _dumps(a) != _dumps(b)), min(len(old), len(messages)))
            raise self.fail(2, f"compress changed its input (first changed message: {idx})", old, where)
        if out is messages:
            raise self.fail(2, "compress returned the caller's list object instead of a new list", messages, where)
        if not isinstance(out, list):
            raise self.fail(1, f"compress returned a {type(out).__name__}, not a list", messages, where)
        self.check_output(engine, messages, out, where)
        return out

    def check_output(self, engine: ContextEngine, inp: list[Message], out: list[Message], where: str) -> None:
        self.count(1)
        errors = [v for v in validate(out) if v.severity == "error"]
        if errors and not [v for v in validate(inp) if v.severity == "error"]:
            shown = "; ".join(str(v) for v in errors[:5])
            raise self.fail(1, f"valid input gave invalid output: {shown}\n  output:\n{show_messages(out)}", inp, where)
        self.check_fabrication(inp, out, where)
        self.check_anchors(inp, out, where, engine=engine)
        if self.deterministic:
            self.check_facts(engine, inp, out, where)

    def check_fabrication(self, inp: list[Message], out: list[Message], where: str) -> None:
        self.count(4)
        verbatim = {_dumps(m) for m in inp}
        result_ids = {m.get("tool_call_id") for m in inp if m.get("role") == "tool"}
        call_sets = [{(tool_call_id(c), tool_call_name(c)) for c in tool_calls(m)} for m in inp if m.get("role") == "assistant" and tool_calls(m)]
        roles = {m.get("role") for m in inp}
        source_text = "\n".join(message_text(m) for m in inp)
        for j, m in enumerate(out):
            if not isinstance(m, dict):
                raise self.fail(1, f"output message {j} is a {type(m).__name__}", inp, where)
            if _dumps(m) in verbatim or is_summary(m):
                continue
            role = m.get("role")
            calls = tool_calls(m)
            if role == "tool":
                if m.get("tool_call_id") in result_ids:
                    continue
                raise self.fail(4, f"output message {j} is a tool result for call id {m.get('tool_call_id')!r}, which no input tool message answers: {show_messages([m])}", inp, where)
            if role == "assistant" and calls:
                pairs = {(tool_call_id(c), tool_call_name(c)) for c in calls}
                if not any(pairs <= s for s in call_sets):
                    raise self.fail(4, f"output message {j} has tool calls {sorted(pairs)} that no single input assistant message issued", inp, where)
                text = content_text(m.get("content"))
            elif role in roles:
                text = message_text(m)
            else:
                raise self.fail(4, f"output message {j} has role {role!r}, which no input message has, and is not a marked summary", inp, where)
            for line in text.splitlines():
                s = line.strip()
                if s and s not in source_text and not _is_annotation(s):
                    raise self.fail(
                        4,
                        f"output message {j} ({role}) is not an input message and not a marked summary, and its line {s[:200]!r} occurs in no input message",
                        inp,
                        where,
                    )

    def check_anchors(self, inp: list[Message], out: list[Message], where: str, *, final: bool = False, engine: ContextEngine | None = None) -> None:
        self.count(5)
        if not final and inp and inp[0].get("role") in ("system", "developer"):
            first = out[0] if out else {}
            if first.get("role") != inp[0].get("role") or content_text(inp[0].get("content")) not in content_text(first.get("content")):
                raise self.fail(5, "the system prompt is not the first output message with its text intact", inp, where)
        users = [m for m in inp if m.get("role") == "user" and not is_summary(m)]
        if not users:
            return
        kept = Counter(_dumps(m) for m in out if m.get("role") == "user")
        summaries = "\n".join(content_text(m.get("content")) for m in out if is_summary(m))
        needed = Counter(_dumps(m) for m in users)
        if self.anchors_overflow(inp):
            # the anchors alone overflow the window: something of them has to give
            self.report.anchors_beyond_window += 1
            users = users[-1:] if not final else []
        retrievable = getattr(engine, "retrievable", None)
        latest = users[-1] if users else None
        for u in users:
            key = _dumps(u)
            if kept[key] >= needed[key]:
                continue
            text = content_text(u.get("content")).strip()
            if u is not latest and callable(retrievable) and text and retrievable(content_text(u.get("content"))):
                continue  # an older message kept in the store, quoted briefly or not at all
            if not summaries or text not in summaries:
                idx = inp.index(u)
                raise self.fail(5, f"user message {idx} is neither in the output verbatim nor quoted verbatim in a marked summary: {show_messages([u])}", inp, where)
        if not final and users and _dumps(users[-1]) not in kept:
            raise self.fail(5, f"the latest user message (input message {inp.index(users[-1])}) is not in the output verbatim", inp, where)

    def anchors_overflow(self, messages: list[Message]) -> bool:
        """True when the system prompt and the user messages alone exceed the window."""
        anchors = [m for i, m in enumerate(messages) if m.get("role") == "user" or (i == 0 and m.get("role") in ("system", "developer"))]
        return estimate_messages_tokens(anchors) > self.context_length > 0

    def check_facts(self, engine: ContextEngine, inp: list[Message], out: list[Message], where: str) -> None:
        self.count(8)
        facts = extract_facts(inp, include_users=False)
        facts.users = list(dict.fromkeys(t for m in inp if m.get("role") == "user" and not is_summary(m) for t in [content_text(m.get("content"))] if t.strip()))
        missing = missing_facts(facts, context_text(out))
        retrievable = getattr(engine, "retrievable", None)
        if len(missing) and callable(retrievable):
            for kind in FACT_KINDS:
                setattr(missing, kind, [f for f in getattr(missing, kind) if not retrievable(f)])
        if len(missing) and estimate_messages_tokens(out) + estimate("\n".join(missing.all())) > self.context_length > 0:
            # keeping them would not fit the window: the documented trade-off (kept in a store)
            self.report.facts_beyond_window += len(missing)
            return
        if len(missing):
            shown = "; ".join(f"{k}: {[f[:120] for f in getattr(missing, k)[:3]]}" for k in FACT_KINDS if getattr(missing, k))
            raise self.fail(8, f"{len(missing)} fact(s) of the input are missing from the output: {shown}", inp, where)

    def check_prefix(self, prev_in: list[Message], prev_out: list[Message], inp: list[Message], out: list[Message], where: str) -> None:
        if self.anchors_overflow(inp):
            # nothing can fit: squeezing what was already cut is the engine's last resort
            self.report.anchors_beyond_window += 1
            return
        self.count(7)
        before = {_dumps(m) for m in prev_in}
        a = [_dumps(m) for m in prev_out]
        written = [(i, key) for i, (key, m) in enumerate(zip(a, prev_out, strict=True)) if key not in before and not _is_fold(m)]
        now = [_dumps(m) for m in out]
        first = next((i for i, (x, y) in enumerate(zip(now, a, strict=False)) if x != y), min(len(now), len(a)))
        if first < len(out) and _is_fold(out[first]):
            return  # a span from `first` on was folded into a summary: one batch rewrite
        left = Counter(now)
        for i, key in written:
            if left[key] > 0:
                left[key] -= 1
                continue
            raise self.fail(
                7,
                f"this compaction re-edited message {i}, which the previous compaction wrote (records are final; "
                f"only a fold of the span into a marked summary may replace them)\n"
                f"  previous output:\n{show_messages(prev_out)}\n  this output:\n{show_messages(out)}",
                inp,
                where,
            )

    # -- one example ------------------------------------------------------------------------------
    def run(self, conv: list[Message]) -> None:
        self.report.examples += 1
        tokens = estimate_messages_tokens(conv)
        engine, sid = self.fresh()
        out = self.compress(engine, conv, tokens, "forced compress() of the whole conversation")
        engine.on_session_end(sid, out)
        if self.deterministic:
            engine2, sid2 = self.fresh()
            out2 = self.compress(engine2, conv, tokens, "forced compress(), second fresh engine")
            engine2.on_session_end(sid2, out2)
            self.count(6)
            if _dumps(out) != _dumps(out2):
                raise self.fail(6, f"two fresh engines compressed the same input differently\n  first:\n{show_messages(out)}\n  second:\n{show_messages(out2)}", conv, "forced compress()")
        sent = self.replay(conv)
        if self.deterministic:
            again = self.replay(conv)
            self.count(6)
            for k, (x, y) in enumerate(zip(sent, again, strict=True)):
                if _dumps(x) != _dumps(y):
                    raise self.fail(6, f"request {k} of the replay differs between two fresh engines", x, "per-turn replay")

    def replay(self, conv: list[Message]) -> list[list[Message]]:
        engine, sid = self.fresh()
        points = sorted({i for i, m in enumerate(conv) if m.get("role") == "assistant" and i > 0} | {len(conv)})
        sent: list[list[Message]] = []
        context: list[Message] = []
        last = 0
        previous: tuple[list[Message], list[Message]] | None = None
        for k, p in enumerate(points):
            request = context + conv[last:p]
            last = p
            tokens = estimate_messages_tokens(request)
            where = f"per-turn replay, request {k} ({tokens:,} estimated tokens, threshold {self.threshold:,})"
            try:
                triggered = bool(engine.should_compress(tokens))
                fire = should_compact(engine, tokens, request)  # the trigger every caller uses
            except EngineError as exc:
                raise self.fail(1, str(exc), request, where) from exc
            except Exception as exc:
                raise self.fail(1, f"should_compress raised {type(exc).__name__}: {exc}", request, where) from exc
            if self.threshold > 0 and tokens * 2 <= self.threshold:
                self.count(3)
                if triggered:
                    raise self.fail(3, f"should_compress({tokens}) is True at under half the threshold ({self.threshold})", request, where)
            if fire:
                out = self.compress(engine, request, tokens, where)
                self.report.turn_compactions += 1
                if previous is not None:
                    self.check_prefix(previous[0], previous[1], request, out, where)
                previous = (request, out)
            else:
                out = request
            sent_tokens = estimate_messages_tokens(out)
            engine.update_from_response({"prompt_tokens": sent_tokens, "completion_tokens": 16, "total_tokens": sent_tokens + 16})
            sent.append(out)
            context = list(out)
        final = sent[-1] if sent else []
        self.check_anchors(conv, final, "after the replay: the last request against the whole conversation", final=True, engine=engine)
        if self.deterministic:
            self.check_facts(engine, conv, final, "after the replay: the last request against the whole conversation")
        engine.on_session_end(sid, final)
        return sent


    # -- the kernel's guarantees ---------------------------------------------------------------
    def kernel(self, conv: list[Message]) -> None:
        """Replay ``conv`` through a :class:`~ctxengine.ContextManager` serving this engine
        (the one agent loop, an in-memory store): every request fits the window by the o200k
        count (invariant 10), and every fact of the conversation is in the last request or
        returned verbatim by recall (invariant 11)."""
        from ctxengine.manager import ContextManager
        from ctxengine.store.sqlite import SqliteStore

        store = SqliteStore(":memory:")
        mgr = ContextManager(Config(), model="contract", context_length=self.context_length, store=store, engine_factory=self._make, strict=False)
        sid = "contract-kernel"
        exact = mgr.window_counter

        def after(k: int, request: list[Message], appended: list[Message]) -> None:
            tokens = sum(exact.exact_messages(request))
            self.count(10)
            if tokens > mgr.window.limit:
                raise self.fail(10, f"request {k} is {tokens:,} o200k tokens, over the limit {mgr.window.limit:,}", request, "kernel replay")
            mgr.update_from_response({"prompt_tokens": tokens, "completion_tokens": 16}, session_id=sid)

        try:
            try:
                last, _ = replay(conv, lambda w: mgr.prepare(w, session_id=sid), after)
            except ContextWindowError:
                if not self.anchors_overflow(conv):
                    raise
                self.report.anchors_beyond_window += 1
                return
            first_assistant = max((i for i, m in enumerate(conv) if m.get("role") == "assistant"), default=len(conv))
            facts = extract_facts(conv[:first_assistant])
            missing = missing_facts(facts, context_text(last))
            self.count(11)
            lost = [f for f in missing.all() if not mgr.retrievable(f, session_id=sid)]
            if lost:
                raise self.fail(11, f"{len(lost)} fact(s) neither in the last request nor returned by recall: {lost[:5]}", conv, "kernel replay")
        finally:
            mgr.close()
            store.close()

    def thrash(self) -> None:
        """A session with a giant output early on, replayed at the engine level (the engine's
        own trigger, no kernel guard): the engine compacts on at most
        :data:`MAX_CONSECUTIVE_COMPACTIONS` consecutive turns (invariant 12)."""
        session = giant_output_session(self.context_length)
        engine, sid = self.fresh()
        streak = best = 0
        context: list[Message] = []
        initial, chunks = recorded_turns(session)
        request = initial
        for k, chunk in enumerate(chunks):
            tokens = estimate_messages_tokens(request)
            where = f"giant-output session, request {k}"
            try:
                fire = should_compact(engine, tokens, request)
                out = run_compress(engine, request, tokens=tokens).output if fire else request
            except EngineError as exc:
                raise self.fail(1, str(exc), request, where) from exc
            changed = out != request
            streak = streak + 1 if changed else 0
            best = max(best, streak)
            sent = estimate_messages_tokens(out)
            engine.update_from_response({"prompt_tokens": sent, "completion_tokens": 16, "total_tokens": sent + 16})
            context = list(out)
            request = [*context, *chunk]
        engine.on_session_end(sid, context)
        self.count(12)
        self.report.max_consecutive_compactions = best
        if best > MAX_CONSECUTIVE_COMPACTIONS:
            raise self.fail(12, f"the engine compacted on {best} consecutive turns (at most {MAX_CONSECUTIVE_COMPACTIONS})", session, "giant-output session")


def giant_output_session(context_length: int, turns: int = 14) -> list[Message]:
    """A coding session whose second tool output alone is about three windows (for windows up
    to ~100K tokens), followed by small turns: an engine that nibbles instead of cutting the
    giant compacts on every turn."""
    lines = max(200, min(context_length // 5, 20_000))  # about 3 windows (at most ~300K tokens)
    giant = "\n".join(f"/sys/devices/platform/serial8250/tty/ttyS{i}/power/runtime_status" for i in range(lines))
    msgs: list[Message] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "List the devices under /sys and fix src/Serial.java"},
    ]
    for k in range(turns):
        cid = f"g{k}"
        msgs.append({"role": "assistant", "content": None, "tool_calls": [{"id": cid, "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": f"step {k}"})}}]})
        msgs.append({"role": "tool", "tool_call_id": cid, "content": giant if k == 1 else f"ok {k}: src/Serial.java line {k}"})
    msgs.append({"role": "assistant", "content": "done"})
    return msgs
