"""The lossless engine (``lcm``): every original kept in the session store, old spans folded
into summary nodes the agent can expand again.

Each ``compress`` call first records the whole working context in the store (content-addressed,
so only new messages are written). The context is then laid out as::

    system prompt(s) │ summary nodes │ latest user message │ summary nodes │ fresh tail

* The **fresh tail** (the last ``fresh_tail_messages`` messages, at most ``fresh_tail_ratio``
  of the window, at least the last tool group) and the **latest user message** stay verbatim.
  Summary messages before that user message have the user role; those after it (the agent's
  work since) the assistant role, so the latest user message stays the last user-role one.
* Every run of original messages between them is cut into chunks of at most
  ``leaf_chunk_tokens`` (whole tool groups: a call and its results are never split) and each
  chunk becomes a **leaf node** (depth 0). Its text starts ``[ctxengine:lcm node=<id> depth=0]``
  (so :func:`ctxengine.messages.is_summary` recognises it), names the tools that expand it, and
  carries a digest: every user message of the span verbatim, then tool names, error lines, file
  paths, URLs and short assistant excerpts, by priority, up to ``leaf_target_tokens``; what does
  not fit is counted and stays one ``lcm_grep`` away.
* When ``condense_after`` nodes of the same depth sit side by side, they are **condensed** into
  one node of depth + 1 whose children are those nodes: a DAG that points down to the originals.
* With a summarizer (``auxiliary.compression.model`` or ``summarizer=``) the digest body is the
  LLM's text instead. Escalation guarantees progress: the LLM with the target budget, then with
  half of it, then the deterministic digest cut to the budget. A summary that would not be
  shorter than its span is never written: the span stays verbatim.

Node ids are content addresses of (depth, children), so the same input gives the same
nodes, and a node that already exists is reused with its stored text (the context prefix stays
byte-stable, and no LLM call is repeated).

Tools for the agent: ``lcm_grep``, ``lcm_describe`` and ``lcm_expand``, the lossless engine's
names for the shared store-backed recall (:class:`ctxengine.recall.Recall`, ``ctx_grep`` …).
The digest and the cut of giant outputs are the kit's (:mod:`ctxengine.engines.kit`).

The engine never imports the store: it receives an object with the methods of
:class:`LcmStore` (:class:`ctxengine.engines.kit.nodes.NodeStore`; ``ctxengine.store``
backends have them). Node headers are :func:`ctxengine.engines.kit.nodes.node_text_header`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, cast

from ctxengine.boundaries import group_spans
from ctxengine.config import LcmConfig
from ctxengine.engine import CompactionReport, ContextEngine, Services
from ctxengine.engines.kit import cut_output
from ctxengine.engines.kit.build import checked, configured_summarizer, session_counter
from ctxengine.engines.kit.digest import digest
from ctxengine.engines.kit.nodes import NodeStore, node_text_header
from ctxengine.engines.kit.originals import node_id
from ctxengine.engines.kit.records import NODE_RE
from ctxengine.engines.kit.tail import tail_by_budget
from ctxengine.errors import ConfigError, NotFoundError, SummarizerError
from ctxengine.facts import FACT_KINDS, Facts, extract_facts
from ctxengine.messages import Message, content_text, is_summary
from ctxengine.models import DEFAULT_CONTEXT_LENGTH
from ctxengine.recall import (
    DESCRIBE_TOOL,
    EXPAND_DEFAULT_TOKENS,
    EXPAND_TOOL,
    GREP_TOOL,
    LCM_ALIASES,
    Recall,
)
from ctxengine.redact import redact
from ctxengine.summarize.base import Summarizer
from ctxengine.tokens import MessageTokens, TokenCounter, estimate

__all__ = ["NODE_RE", "LcmEngine", "LcmStore", "digest"]

log = logging.getLogger("ctxengine.engines.lcm")


LcmStore = NodeStore
"""What the engine needs from a session store (``ctxengine.store`` backends provide it)."""


@dataclass(slots=True)
class _Item:
    """One unit of the foldable region: a summary node or an original tool group / message."""

    start: int
    end: int
    node_id: str | None = None
    depth: int = -1
    text: str = ""
    message: Message | None = None  # an existing summary message, re-emitted byte for byte

    @property
    def is_node(self) -> bool:
        return self.node_id is not None


class LcmEngine(ContextEngine):
    """Lossless context management over a session store (see the module docstring)."""

    threshold_ratio = 0.75
    Settings: ClassVar[type[LcmConfig]] = LcmConfig

    def __init__(
        self,
        *,
        store: LcmStore,
        context_length: int = DEFAULT_CONTEXT_LENGTH,
        threshold: float | None = None,
        fresh_tail_messages: int = 16,
        fresh_tail_ratio: float = 0.25,
        condense_after: int = 4,
        leaf_target_tokens: int = 1200,
        leaf_chunk_tokens: int = 20_000,
        leaf_fact_tokens: int = 4000,
        summarizer: Summarizer | None = None,
        counter: TokenCounter | None = None,
        session_id: str = "default",
    ) -> None:
        """``store`` is required: lossless means the originals live somewhere.

        Defaults: fire at 75 % of the window (later than the compressor, because nothing is
        lost and the summaries stay small); keep the last 16 messages (at most a quarter of
        the window) verbatim; leaf digests of about 1,200 tokens for chunks of up to 20,000
        tokens, plus up to 4,000 tokens of verbatim facts (paths, URLs, tools, errors; the
        rest is retrievable); condense four same-depth nodes into one.
        """
        if store is None:
            raise ConfigError("the lcm engine needs a session store (store=...): it keeps every original there")
        super().__init__(context_length=context_length, threshold=threshold)
        self.store = store
        self.fresh_tail_messages = int(fresh_tail_messages)
        self.fresh_tail_ratio = float(fresh_tail_ratio)
        self.condense_after = max(2, int(condense_after))
        self.leaf_target_tokens = int(leaf_target_tokens)
        self.leaf_chunk_tokens = int(leaf_chunk_tokens)
        self.leaf_fact_tokens = int(leaf_fact_tokens)
        self.summarizer = summarizer
        self.tokens = MessageTokens.of(counter)  # each message's count: the session's, else the engine's own
        self.counter: TokenCounter = self.tokens.counter
        self.session_id = session_id
        self._hows: list[str] = []
        self._facts_tight = False
        self._fact_cache: dict[int, Facts] = {}
        self.deterministic = summarizer is None
        self.calls_model = summarizer is not None
        self._recall: Recall | None = None

    @classmethod
    def from_config(cls, settings: LcmConfig | None = None, services: Services | None = None) -> LcmEngine:
        """The ``lcm:`` section; the store is ``services.store`` (required: engines never open
        one), the summarizer ``services.summarizer`` or the configured ``auxiliary.compression``
        model."""
        settings, services = checked(LcmConfig, settings, services)
        if services.store is None:
            raise ConfigError(
                "the lcm engine needs a session store: build it through ContextManager or pass "
                "store=ctxengine.store.open_store(config.store) (store.enabled must not be false)"
            )
        summarizer = configured_summarizer(services.config, services.summarizer)
        return cls(store=cast(LcmStore, services.store), context_length=services.context_length, summarizer=summarizer, counter=session_counter(services), session_id=services.session_id, **settings.model_dump())

    @property
    def name(self) -> str:
        return "lcm"

    # -- lifecycle ------------------------------------------------------------------------------
    def on_session_start(self, session_id: str, **kwargs: Any) -> None:
        """Records and tool calls go to ``session_id`` from now on."""
        if session_id:
            self.session_id = str(session_id)

    def on_session_end(self, session_id: str, messages: list[Message]) -> None:
        """Keep the final history too (nothing is ever lost at a session boundary)."""
        if messages:
            self.store.record_messages(session_id or self.session_id, messages)

    def update_from_response(self, usage: Any) -> None:
        self._record_usage(usage)

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        tokens = self.last_prompt_tokens if prompt_tokens is None else int(prompt_tokens)
        return tokens >= self.threshold_tokens > 0

    def should_compress_preflight(self, messages: list[Message]) -> bool:
        return self.tokens.count_messages(messages) >= self.threshold_tokens > 0

    # -- compaction ---------------------------------------------------------------------------------
    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        """Fold the oldest spans outside the fresh tail into summary nodes (see the module doc).

        Always returns a new list; when nothing can be folded it equals the input.
        """
        t0 = time.perf_counter()
        msgs = list(messages)
        before = self.tokens.count_messages(msgs)
        report = CompactionReport(self.name, len(msgs), len(msgs), before, before)
        if not msgs:
            self.last_report = report
            return []
        ids = self.store.record_messages(self.session_id, msgs)
        tail_cuts = self._cut_giant_outputs(msgs, ids)
        head = 0
        while head < len(msgs) and msgs[head].get("role") in ("system", "developer"):
            head += 1
        units = [u for u in group_spans(msgs) if u[0] >= head]
        tail_start = self._tail_start(msgs, units)
        latest_user = max((i for i, m in enumerate(msgs) if m.get("role") == "user" and not is_summary(m)), default=-1)
        items = self._items(msgs, units, tail_start)
        notes: list[str] = []
        self._hows = []
        self._fact_cache = {}
        # fold runs of originals (the latest user message is a barrier and stays verbatim)
        layer, replaced = self._fold(msgs, ids, items, latest_user, focus_topic)
        layer = self._condense(layer, focus_topic, notes)
        out_middle = _laid_out(layer, msgs, latest_user)
        tail = [tail_cuts.get(i, msgs[i]) for i in range(tail_start, len(msgs))]
        replaced.extend(i for i in tail_cuts if i >= tail_start)
        out = [*msgs[:head], *out_middle, *tail]
        after = self.tokens.count_messages(out)
        if after >= before:
            # never grow the context: nothing worth folding yet
            out = list(msgs)
            after = before
            replaced = []
            notes.append("nothing to fold: the spans outside the fresh tail are too small to shrink")
        else:
            self.compression_count += 1
        report.messages_after = len(out)
        report.tokens_after = after
        report.replaced = sorted(set(replaced))
        report.notes = notes
        report.fallback = "extractive" if "extractive-after-llm" in self._hows else None
        self._fact_cache = {}  # keyed by object id: valid only while the input list is alive
        report.elapsed_ms = (time.perf_counter() - t0) * 1000.0
        self.last_report = report
        return out

    def _cut_giant_outputs(self, msgs: list[Message], ids: list[str]) -> dict[int, Message]:
        """Tool outputs larger than the whole fresh-tail budget, cut with the kit's one cut
        (head and tail lines plus the facts of the removed middle) before they are sent; each
        cut output is a one-message node, so ``lcm_expand`` returns it whole."""
        limit = int(self.context_length * self.fresh_tail_ratio)
        cuts: dict[int, Message] = {}
        for i, m in enumerate(msgs):
            if m.get("role") != "tool" or is_summary(m):
                continue
            tokens = self.tokens.message(m)
            if tokens <= limit:
                continue
            children = [("message", ids[i])]
            nid = node_id(0, children)
            text = self._existing(nid)
            if text is None:
                text = cut_output(content_text(m.get("content")), budget_tokens=max(200, limit // 4) + min(self.leaf_fact_tokens, self.context_length // 16), ref=nid, counter=self.counter)
                self.store.add_node(self.session_id, nid, depth=0, text=text, children=children, meta={"messages": 1, "tokens": tokens, "summarizer": "cut"})
            cuts[i] = {**m, "content": text}
        return cuts

    def _tail_start(self, msgs: list[Message], units: list[tuple[int, int]]) -> int:
        """First index of the fresh tail: whole units from the end, at most
        ``fresh_tail_messages`` messages and ``fresh_tail_ratio`` of the window, at least one unit."""
        return tail_by_budget(msgs, max_messages=self.fresh_tail_messages, max_tokens=int(self.context_length * self.fresh_tail_ratio), count=self.tokens.count_messages, spans=units)

    def _chunks(self, msgs: list[Message], run: list[_Item]) -> list[list[_Item]]:
        chunks: list[list[_Item]] = []
        cur: list[_Item] = []
        size = 0
        for it in run:
            t = self.tokens.count_messages(msgs[it.start : it.end])
            # a small start (a short user message) joins the next group rather than stand alone
            if cur and size + t > self.leaf_chunk_tokens and size >= self.leaf_chunk_tokens // 4:
                chunks.append(cur)
                cur, size = [], 0
            cur.append(it)
            size += t
        if cur:
            chunks.append(cur)
        return chunks

    def _leaf(self, msgs: list[Message], ids: list[str], chunk: list[_Item], focus_topic: str | None) -> _Item | None:
        span = [m for it in chunk for m in msgs[it.start : it.end]]
        span_ids = [i for it in chunk for i in ids[it.start : it.end]]
        children = [("message", i) for i in span_ids]
        nid = node_id(0, children)
        text = self._existing(nid)
        span_tokens = self.tokens.count_messages(span)
        if text is None:
            header = node_text_header(nid, 0, len(span), len(span))
            body, how = self._summarize(span, span_tokens, focus_topic)
            self._hows.append(how)
            text = f"{header}\n{body}" if body else header
            if self.counter.count_messages([{"role": "user", "content": text}]) >= span_tokens:
                return None
            self.store.add_node(self.session_id, nid, depth=0, text=text, children=children, meta={"messages": len(span), "tokens": span_tokens, "summarizer": how})
        return _Item(chunk[0].start, chunk[-1].end, nid, 0, text)

    def _existing(self, node_id: str) -> str | None:
        try:
            return str(self.store.get_node(node_id).text)
        except NotFoundError:
            return None

    def _items(self, msgs: list[Message], units: list[tuple[int, int]], tail_start: int) -> list[_Item]:
        """The units before the fresh tail: a summary node this engine stored (re-emitted as
        it is) or an original tool group / message."""
        items: list[_Item] = []
        for s, e in units:
            if s >= tail_start:
                break
            m = msgs[s]
            match = NODE_RE.match(content_text(m.get("content"))) if e - s == 1 and m.get("role") in ("user", "assistant") and not m.get("tool_calls") else None
            if match and self._existing(match.group(1)) is not None:
                items.append(_Item(s, e, match.group(1), int(match.group(2)), content_text(m.get("content")), m))
            else:
                items.append(_Item(s, e))
        return items

    def _fold(self, msgs: list[Message], ids: list[str], items: list[_Item], latest_user: int, focus_topic: str | None) -> tuple[list[_Item | Message], list[int]]:
        """``items`` as one layer, each run of foldable originals folded into leaf nodes
        chunk by chunk (a chunk whose node would not be shorter stays verbatim), and the
        indices of the messages folded."""
        layer: list[_Item | Message] = []
        replaced: list[int] = []
        run: list[_Item] = []

        def flush() -> None:
            for chunk in self._chunks(msgs, run):
                node = self._leaf(msgs, ids, chunk, focus_topic)
                if node is None:
                    layer.extend(m for it in chunk for m in msgs[it.start : it.end])
                    continue
                layer.append(node)
                replaced.extend(range(chunk[0].start, chunk[-1].end))
            run.clear()

        # originals a previous compaction left before a summary (a then-latest user message) stay:
        # folding them would rewrite the compacted prefix the prompt cache already holds
        # (a group holding an output cut earlier counts as such a summary: it was one)
        last_node = max((k for k, it in enumerate(items) if it.is_node or any(is_summary(m) for m in msgs[it.start : it.end])), default=-1)
        foldable = [m for k, it in enumerate(items) if not it.is_node and k > last_node and not it.start <= latest_user < it.end for m in msgs[it.start : it.end]]
        self._facts_tight = self._facts_would_overflow(msgs, foldable)
        for k, it in enumerate(items):
            if it.is_node:
                flush()
                layer.append(it)
            elif k < last_node or it.start <= latest_user < it.end:
                flush()
                layer.extend(msgs[it.start : it.end])
            else:
                run.append(it)
        flush()
        return layer, replaced

    def _summarize(self, span: Sequence[Message], span_tokens: int, focus_topic: str | None) -> tuple[str, str]:
        """The digest body and how it was made: LLM → shorter LLM → deterministic digest."""
        target = self.leaf_target_tokens
        if self.summarizer is not None:
            for budget in (target, max(100, target // 2)):
                try:
                    text = self.summarizer.summarize(span, focus_topic=focus_topic, budget_tokens=budget).strip()
                except SummarizerError as exc:
                    log.warning("lcm: summarizer failed (%s); escalating", redact(str(exc)))
                    continue
                if text and estimate(text) <= int(budget * 1.5) and estimate(text) < span_tokens // 2:
                    users = _quoted_users(span, text)
                    return (f"{users}\n{text}" if users else text), f"llm:{budget}"
            return digest(span, budget_tokens=target, fact_tokens=self._fact_budget(), recall_hint="lcm_grep"), "extractive-after-llm"
        return digest(span, budget_tokens=target, fact_tokens=self._fact_budget(), facts=self._facts(span), recall_hint="lcm_grep"), "extractive"

    def _facts(self, messages: Sequence[Message]) -> Facts:
        """Facts of ``messages``, extracted once per message object within a ``compress`` call
        (the overflow check and the digests read the same messages)."""
        merged: dict[str, dict[str, None]] = {k: {} for k in FACT_KINDS}
        for m in messages:
            if is_summary(m):
                continue
            f = self._fact_cache.get(id(m))
            if f is None:
                f = extract_facts([m])
                self._fact_cache[id(m)] = f
            for k in FACT_KINDS:
                merged[k].update(dict.fromkeys(getattr(f, k)))
        return Facts(*(list(merged[k]) for k in FACT_KINDS))

    def _fact_budget(self) -> int:
        """Verbatim fact tokens one node may show: ``leaf_fact_tokens``; when showing every fact
        of the folded spans would not fit the window, at most 1/16 of the window per node (the
        rest stays one ``lcm_grep`` away)."""
        if self._facts_tight:
            return min(self.leaf_fact_tokens, self.context_length // 16)
        return self.leaf_fact_tokens

    def _facts_would_overflow(self, msgs: list[Message], foldable: list[Message]) -> bool:
        """True when the context with every fact of ``foldable`` shown verbatim would exceed the
        window: what is not folded, plus the facts, plus the user texts the digests quote."""
        if not foldable:
            return False
        folded = {id(m) for m in foldable}
        kept = self.tokens.count_messages([m for m in msgs if id(m) not in folded])
        facts = self._facts(foldable)
        shown = sum(estimate(f) + 2 for f in facts.all())
        return kept + shown > self.context_length

    def _condense(self, layer: list[_Item | Message], focus_topic: str | None, notes: list[str]) -> list[_Item | Message]:
        """Merge ``condense_after`` adjacent nodes of one depth into a node one level up, repeatedly."""
        changed = True
        while changed:
            changed = False
            i = 0
            while i < len(layer):
                first = layer[i]
                if not isinstance(first, _Item):
                    i += 1
                    continue
                group: list[_Item] = []
                for x in layer[i : i + self.condense_after]:
                    if not isinstance(x, _Item) or x.depth != first.depth:
                        break
                    group.append(x)
                if len(group) == self.condense_after:
                    node = self._condensed(group, focus_topic)
                    layer[i : i + self.condense_after] = [node]
                    notes.append(f"condensed {len(group)} depth-{first.depth} nodes into {node.node_id}")
                    changed = True
                i += 1
        return layer

    def _condensed(self, group: list[_Item], focus_topic: str | None) -> _Item:
        depth = group[0].depth + 1
        children = [("node", str(it.node_id)) for it in group]
        nid = node_id(depth, children)
        text = self._existing(nid)
        if text is None:
            originals: list[Message] = []
            for it in group:
                originals.extend(m for _, m in self.store.node_messages(str(it.node_id)))
            header = node_text_header(nid, depth, len(originals), len(group))
            body, how = self._summarize(originals, self.counter.count_messages(originals), focus_topic)
            self._hows.append(how)
            text = f"{header}\n{body}" if body else header
            self.store.add_node(self.session_id, nid, depth=depth, text=text, children=children, meta={"messages": len(originals), "summarizer": how})
        return _Item(group[0].start, group[-1].end, nid, depth, text)

    # -- tools: the shared store-backed recall under the lcm_* names -------------------------
    @property
    def recall(self) -> Recall:
        """``lcm_grep``/``lcm_describe``/``lcm_expand``: aliases of the shared recall tools."""
        if self._recall is None or self._recall.session_id != self.session_id:
            self._recall = Recall(self.store, self.session_id, counter=self.counter, aliases=LCM_ALIASES, tools=(GREP_TOOL, DESCRIBE_TOOL, EXPAND_TOOL))
        return self._recall

    def get_tool_schemas(self) -> list[dict[str, Any]]:
        return self.recall.tool_schemas()

    def handle_tool_call(self, name: str, args: Mapping[str, Any], **kwargs: Any) -> str:
        """Run ``lcm_grep``, ``lcm_describe`` or ``lcm_expand``; errors come back as ``{"error": ...}``."""
        if name not in LCM_ALIASES:
            return json.dumps({"error": f"Unknown tool: {name}"})
        return self.recall.handle(name, args)

    def expand(self, node_id: str, max_tokens: int = EXPAND_DEFAULT_TOKENS, offset: int = 0) -> dict[str, Any]:
        """``lcm_expand``: the originals under a node, verbatim, from ``offset`` within ``max_tokens``."""
        return self.recall.expand(node_id, max_tokens=max_tokens, offset=offset)

    def retrievable(self, fact: str) -> bool:
        """True when ``lcm_grep`` over this session returns ``fact`` verbatim (DESIGN §3.3 #8:
        a fact not in the context must be retrievable from the store)."""
        return self.recall.retrievable(fact)

    def get_status(self) -> dict[str, Any]:
        status = super().get_status()
        status["session_id"] = self.session_id
        return status


def _laid_out(layer: list[_Item | Message], msgs: list[Message], latest_user: int) -> list[Message]:
    """The messages of ``layer``: a node as its summary message, in the user's role before the
    latest user message (``msgs[latest_user]``) and the assistant's after it (its account of
    the work since), so that message stays the last user-role message of the request."""
    out: list[Message] = []
    role = "user"
    for entry in layer:
        if isinstance(entry, _Item):
            out.append(entry.message if entry.message is not None else {"role": role, "content": entry.text})
        else:
            out.append(entry)
            if latest_user >= 0 and entry is msgs[latest_user]:
                role = "assistant"
    return out


def _quoted_users(span: Sequence[Message], text: str) -> str:
    """User messages of ``span`` that ``text`` does not quote verbatim, as quote lines."""
    lines = []
    for m in span:
        if m.get("role") == "user" and not is_summary(m):
            t = content_text(m.get("content"))
            if t and t not in text:
                lines.append(f"User: {t}")
    return "\n".join(lines)
