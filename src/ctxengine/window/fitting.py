"""How the window cap cuts a request that is over its limit (:class:`Fitting`, the steps of
:mod:`ctxengine.window` in their order), and what it reports (:class:`CapResult`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxengine.engines.kit.cut import cut_output
from ctxengine.engines.kit.records import GREP_TOOL, header, recall_pointer
from ctxengine.errors import ContextWindowError
from ctxengine.messages import Message, content_text, is_summary
from ctxengine.window.counting import ExactView, WindowCounter, WindowLimit

__all__ = ["HEADROOM_RATIO", "MARKER_TOKENS", "MIN_KEEP_TOKENS", "STUB_TOKENS", "CapResult", "Fitting", "RefFor", "is_first_system", "latest_user"]

HEADROOM_RATIO = 0.05
"""A cut frees this share of the limit beyond the excess, so the next few turns fit without
cutting again (each cut rewrites the cached prefix from that message on)."""

MIN_KEEP_TOKENS = 256
"""A cut leaves at least this much of an output (marker, first lines, facts)."""

STUB_TOKENS = 200
"""What an older user message keeps when even the anchors do not fit (a recall stub)."""

MARKER_TOKENS = 24
"""The least a cut leaves: about the marker line alone (small windows only)."""


@dataclass(slots=True)
class CapResult:
    """What :meth:`WindowCap.fit` did: the messages to send, their exact size, what was cut."""

    messages: list[Message]
    tokens: int
    limit: int
    cut: list[int] = field(default_factory=list)
    stubbed_users: list[int] = field(default_factory=list)
    dropped: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.cut or self.stubbed_users or self.dropped)


RefFor = Callable[[int, Message], str | None]
"""``ref_for(index, message)``: the store id of the original behind a message, or ``None``."""


def is_first_system(messages: Sequence[Message], i: int) -> bool:
    return i == 0 and messages[0].get("role") in ("system", "developer")


def latest_user(messages: Sequence[Message]) -> int:
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m.get("role") == "user" and not is_summary(m):
            return i
    return -1


def fold_message(n: int, users: int, *, recall: bool = True) -> Message:
    """The one line the oldest ``n`` messages (``users`` from the user) fold into."""
    detail = f"{n} earlier message(s), {users} of them from the user, are not shown here; "
    if recall:
        detail += "they are in the session store: ctx_grep finds them, ctx_expand returns them whole"
    else:
        detail += f"they are {recall_pointer(recall)}"
    return {"role": "user", "content": header("folded", detail)}


def _holds_user_words(m: Message) -> bool:
    """Whether ``m`` carries the user's words: a user-role summary (it may open a user message
    whose words follow it) or a summary quoting older user messages (the ledger's ``<<<`` …
    ``>>>`` blocks). Without a store they exist nowhere else: the cap does not cut them."""
    return m.get("role") == "user" or "<<<\n" in content_text(m.get("content"))


class Fitting:
    """One request over ``limit`` cut to it (:meth:`run`): ``result.messages`` is the working
    copy of ``messages``, ``sizes`` their exact sizes, ``total`` their sum."""

    def __init__(
        self,
        counter: WindowCounter,
        window: WindowLimit,
        messages: Sequence[Message],
        result: CapResult,
        sizes: list[int],
        *,
        ref_for: RefFor | None,
        reserve: int = 0,
        recall: bool = True,
        originals: bool = True,
    ) -> None:
        self.counter = counter
        self.window = window
        self._exact = ExactView(counter)
        self.messages = messages
        self.result = result
        self.msgs = result.messages
        self.sizes = sizes
        self.total = result.tokens
        self.limit = result.limit
        self.ref_for = ref_for
        self.reserve = reserve
        self.recall = recall
        self.originals = originals  # the originals of what is cut are kept: user messages may be stubbed
        self.latest = latest_user(self.msgs)
        self.headroom = int(HEADROOM_RATIO * self.limit)

    @property
    def over(self) -> bool:
        return self.total > self.limit

    def ref(self, i: int) -> str | None:
        return self.ref_for(i, self.messages[i]) if self.ref_for is not None else None

    def run(self) -> None:
        """The steps in their order until the request fits; :class:`ContextWindowError` when
        even the anchors overflow."""
        self.cut_outputs()
        if self.over:
            self.cut_arguments()
        self.stub_users()
        if self.over:
            self.drop_exchanges()
        if self.over and self.ref_for is not None:
            self.fold()
        if self.over:
            raise self.overflow()
        self.result.tokens = self.total
        if self.result.cut:
            self.result.notes.append(f"window cap: cut {len(self.result.cut)} message(s) to fit {self.limit:,} tokens")

    def cut_outputs(self) -> None:
        """1. The largest outputs, assistant texts and summaries; still over (many outputs, a
        small window): every one down to its marker."""
        msgs, sizes = self.msgs, self.sizes
        candidates = [
            i
            for i, m in enumerate(msgs)
            if not is_first_system(msgs, i)
            and i != self.latest
            and (m.get("role") in ("tool", "function", "assistant") or (m.get("role") in ("user", "system") and is_summary(m)))
            and isinstance(m.get("content"), str | list)
            and content_text(m.get("content"))
            and (self.originals or not _holds_user_words(m))
        ]
        floor = max(MARKER_TOKENS, min(MIN_KEEP_TOKENS, self.limit // 40))

        def order(k: int) -> tuple[int, int]:
            # tool outputs first (the agent's own words and summaries are worth more), then
            # the rest; small messages last; the largest first within each tier
            big = sizes[k] > 4 * floor
            tier = (0 if msgs[k].get("role") in ("tool", "function") else 1) if big else 2
            return tier, -sizes[k]

        for i in sorted(candidates, key=order):
            if not self.over:
                break
            self.cut_content(i, self.headroom, floor, self.result.cut)
        if self.over:
            for i in sorted(candidates, key=lambda k: sizes[k], reverse=True):
                if not self.over:
                    break
                self.cut_content(i, 0, MARKER_TOKENS, self.result.cut, stub=True)

    def cut_arguments(self) -> None:
        """2. Oversized tool-call arguments, the largest messages first."""
        for i in sorted((k for k, m in enumerate(self.msgs) if m.get("tool_calls")), key=lambda k: self.sizes[k], reverse=True):
            if not self.over:
                break
            self.cut_call(i)

    def stub_users(self) -> None:
        """3. Older user messages become recall stubs, oldest first; still over, and only with
        recall (which returns them whole): older user messages down to the marker alone. Only
        when their originals are kept (``originals``): otherwise a user message is never cut."""
        stub_floor = max(MARKER_TOKENS, min(STUB_TOKENS, self.limit // 40))
        if self.over and self.originals:
            for i, m in enumerate(self.msgs):
                if not self.over:
                    break
                if m.get("role") != "user" or i == self.latest or is_summary(m) or self.sizes[i] <= stub_floor:
                    continue
                before = self.total
                self.cut_content(i, 0, stub_floor, self.result.stubbed_users, stub=True)
                if self.total < before:
                    self.result.notes.append(f"user message {i} is a recall stub: the anchors alone overflow the window")
        if self.over and self.ref_for is not None:
            for i, m in enumerate(self.msgs):
                if not self.over:
                    break
                if m.get("role") != "user" or i == self.latest or is_summary(m):
                    continue
                self.cut_content(i, 0, MARKER_TOKENS, self.result.stubbed_users, stub=True)

    def _replace(self, msgs: list[Message], sizes: list[int]) -> None:
        self.msgs, self.sizes = msgs, sizes
        self.result.messages = msgs
        self.latest = latest_user(msgs)

    def drop_exchanges(self) -> None:
        """4. Remove the oldest whole exchanges (an assistant message and the tool results that
        follow it) until the request fits; never the last exchange, never a user message."""
        msgs, sizes = self.msgs, self.sizes
        groups: list[tuple[int, int]] = []
        i = 0
        while i < len(msgs):
            if msgs[i].get("role") == "assistant":
                j = i + 1
                while j < len(msgs) and msgs[j].get("role") in ("tool", "function"):
                    j += 1
                groups.append((i, j))
                i = j
            else:
                i += 1
        drop: set[int] = set()
        for a, b in groups[:-1]:
            if not self.over:
                break
            drop.update(range(a, b))
            self.total -= sum(sizes[a:b])
            self.result.dropped += b - a
        if drop:
            self.result.notes.append(f"window cap: dropped {len(drop)} message(s) of old exchanges whole (originals in the store)")
            keep = [k for k in range(len(msgs)) if k not in drop]
            msgs, sizes = [msgs[k] for k in keep], [sizes[k] for k in keep]
        self._replace(msgs, sizes)

    def fold(self) -> None:
        """5. Replace the oldest messages after the system prompt, up to the latest user message
        at most, by one line pointing at recall; as few as the limit allows. Never splits a
        tool pair (the folded run never ends between a call and its results)."""
        msgs, sizes = self.msgs, self.sizes
        start = 1 if msgs and is_first_system(msgs, 0) else 0
        latest = latest_user(msgs)
        best: tuple[int, Message, int] | None = None
        removed = users = 0
        for k in range(start + 1, latest + 1):
            gone = msgs[k - 1]
            removed += sizes[k - 1]
            if gone.get("role") == "user":
                users += 1
            if msgs[k].get("role") in ("tool", "function"):
                continue  # a tool result may not lose its call
            line = fold_message(k - start, users, recall=self.recall)
            size = self.counter.exact_message(line)
            best = (k, line, size)
            if self.total - removed + size <= self.limit:
                break
        if best is not None:
            k, line, size = best
            folded = k - start
            self.total = self.total - sum(sizes[start:k]) + size
            self.result.dropped += folded
            where = f", {GREP_TOOL} finds them" if self.recall else ""
            self.result.notes.append(f"window cap: folded the {folded} oldest message(s) into one line (originals in the store{where})")
            msgs, sizes = [*msgs[:start], line, *msgs[k:]], [*sizes[:start], size, *sizes[k:]]
        self._replace(msgs, sizes)

    def overflow(self) -> ContextWindowError:
        """6. Nothing valid can be sent: the error names the sizes."""
        msgs, sizes, latest, reserve, w = self.msgs, self.sizes, self.latest, self.reserve, self.window
        tools = f" - tool definitions {reserve:,}" if reserve else ""
        users = "older user message" if self.originals else "output (no session store keeps the originals, so older user messages are kept whole: enable the store or use a larger window)"
        return ContextWindowError(
            f"the request cannot fit the window: {self.total:,} tokens of messages after cutting every {users} "
            f"(limit {self.limit:,} = window {w.context_length:,} - completion reserve {w.reserve:,} "
            f"- margin {w.margin:,}{tools}); the system prompt and the latest user message alone are "
            f"{sizes[0] if msgs and is_first_system(msgs, 0) else 0:,} + {sizes[latest] if latest >= 0 else 0:,} tokens"
            + (f", the tool definitions {reserve:,}" if reserve else "")
        )

    def cut_content(self, i: int, headroom: int, floor: int, cut_log: list[int], *, stub: bool = False) -> None:
        """Cut message ``i``'s text to what the excess requires plus ``headroom`` (to ``floor``
        as a ``stub``), logging ``i`` in ``cut_log`` when it shrank."""
        ref = self.ref(i)
        msgs, sizes = self.msgs, self.sizes
        m = msgs[i]
        text = content_text(m.get("content"))
        t = sizes[i]
        overhead = t - self.counter.exact_text(text)
        excess = self.total - self.limit
        target = floor if stub else max(floor, t - excess - headroom - overhead)
        if target >= t - overhead:
            return
        new_text = cut_output(text, budget_tokens=target, ref=ref, counter=self._exact, recall=self.recall)
        if new_text == text:
            return
        msgs[i] = {**m, "content": new_text}
        new_size = self.counter.exact_message(msgs[i])
        if new_size >= t:
            msgs[i] = m
            return
        sizes[i] = new_size
        if i not in cut_log:
            cut_log.append(i)
        self.total += new_size - t

    def _cut_call(self, c: Any, excess: int, floor: int, ref: str | None) -> tuple[Any, int]:
        """Call ``c`` with its arguments cut when they are oversized and ``excess`` remains:
        ``(call, tokens freed)``."""
        fn = c.get("function") if isinstance(c, dict) else None
        args = fn.get("arguments") if isinstance(fn, dict) else None
        if excess > 0 and isinstance(fn, dict) and isinstance(args, str) and self.counter.exact_text(args) > floor * 2:
            t = self.counter.exact_text(args)
            cut = cut_output(args, budget_tokens=max(floor, t - excess), ref=ref, counter=self._exact, recall=self.recall)
            if cut != args:
                wrapped = json.dumps({"ctxengine_cut": cut}, ensure_ascii=False)
                return {**c, "function": {**fn, "arguments": wrapped}}, t - self.counter.exact_text(wrapped)
        return c, 0

    def cut_call(self, i: int) -> None:
        """Cut the oversized arguments of message ``i``'s tool calls."""
        ref = self.ref(i)
        msgs, sizes = self.msgs, self.sizes
        m = msgs[i]
        calls = m.get("tool_calls")
        if not isinstance(calls, list):
            return
        new_calls: list[Any] = []
        floor = max(MARKER_TOKENS, min(MIN_KEEP_TOKENS, self.limit // 40))
        changed = False
        excess = self.total - self.limit + self.headroom
        for c in calls:
            new, freed = self._cut_call(c, excess, floor, ref)
            if new is not c:
                excess -= freed
                changed = True
            new_calls.append(new)
        if not changed:
            return
        msgs[i] = {**m, "tool_calls": new_calls}
        new_size = self.counter.exact_message(msgs[i])
        t = sizes[i]
        sizes[i] = new_size
        self.result.cut.append(i)
        self.total += new_size - t
