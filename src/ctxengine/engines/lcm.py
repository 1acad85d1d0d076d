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

Tools for the agent (``get_tool_schemas`` / ``handle_tool_call``): ``lcm_grep`` (substring or
regex search over originals and summaries, this session or all), ``lcm_describe`` (a node's
metadata and children) and ``lcm_expand`` (the originals under a node, verbatim, within a token
budget).

The engine never imports the store: it receives an object with the methods of
:class:`LcmStore` (``ctxengine.store`` backends have them).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ctxengine.boundaries import group_spans
from ctxengine.engine import CompactionReport, ContextEngine
from ctxengine.errors import ConfigError, CtxEngineError, InputError, NotFoundError, SummarizerError
from ctxengine.facts import FACT_KINDS, Facts, extract_facts
from ctxengine.messages import Message, content_text, is_summary, message_text
from ctxengine.models import DEFAULT_CONTEXT_LENGTH
from ctxengine.redact import redact
from ctxengine.summarize.base import Summarizer
from ctxengine.tokens import EstimateCounter, TokenCounter, estimate

if TYPE_CHECKING:
    from ctxengine.config import Config

__all__ = ["NODE_RE", "LcmEngine", "LcmStore"]

log = logging.getLogger("ctxengine.engines.lcm")

NODE_RE = re.compile(r"^\[ctxengine:lcm node=([0-9a-f]+) depth=(\d+)\]")
"""The first line of every lcm summary: node id and depth."""

EXPAND_DEFAULT_TOKENS = 4000
"""Default budget of one ``lcm_expand`` answer: enough for a few tool outputs, small enough
not to undo the compaction it reads from."""

GREP_DEFAULT_LIMIT = 10
_PREVIEW = 160


@runtime_checkable
class LcmStore(Protocol):
    """What the engine needs from a session store (``ctxengine.store`` backends provide it)."""

    def record_messages(self, session_id: str, messages: Sequence[Message]) -> list[str]: ...

    def add_node(
        self,
        session_id: str,
        node_id: str,
        *,
        depth: int,
        text: str,
        children: Sequence[tuple[str, str]],
        meta: Mapping[str, Any] | None = None,
    ) -> bool: ...

    def get_node(self, node_id: str) -> Any: ...

    def node_messages(self, node_id: str) -> list[tuple[str, Message]]: ...

    def get_messages(self, ids: Sequence[str]) -> list[Message]: ...

    def search(self, query: str, *, session_id: str | None = None, mode: Any = "text", limit: int = 20, nodes: bool = True) -> Sequence[Any]: ...


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


def _node_id(depth: int, children: Sequence[tuple[str, str]]) -> str:
    # what a node covers defines it: message ids are chained content addresses, so the same
    # span gives the same node in every session and every run (deterministic output)
    key = json.dumps([depth, [list(c) for c in children]], separators=(",", ":"))
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _header(node_id: str, depth: int, n_messages: int, n_children: int) -> str:
    what = f"{n_messages} earlier messages" if depth == 0 else f"{n_children} summaries of {n_messages} earlier messages"
    return (
        f"[ctxengine:lcm node={node_id} depth={depth}] Summary of {what}; the originals are kept verbatim. "
        f'Expand for details: lcm_expand(node_id="{node_id}") returns them, lcm_describe shows the node, '
        "lcm_grep searches every original."
    )


class LcmEngine(ContextEngine):
    """Lossless context management over a session store (see the module docstring)."""

    threshold_ratio = 0.75

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
        self.counter: TokenCounter = counter or EstimateCounter()
        self.session_id = session_id
        self._hows: list[str] = []
        self._facts_tight = False
        self._fact_cache: dict[int, Facts] = {}
        self.deterministic = summarizer is None

    @classmethod
    def from_config(
        cls,
        config: Config,
        context_length: int,
        *,
        store: LcmStore | None = None,
        summarizer: Summarizer | None = None,
        **services: Any,
    ) -> LcmEngine:
        """Build from ``config.lcm`` (and ``auxiliary.compression`` for an LLM summarizer).

        The store is injected (engines never open one): ``ContextManager`` and the CLI pass
        ``open_store(config.store)``; without one this raises :class:`ConfigError`.
        """
        if store is None:
            raise ConfigError(
                "the lcm engine needs a session store: build it through ContextManager or pass "
                "store=ctxengine.store.open_store(config.store) (store.enabled must not be false)"
            )
        c = config.lcm
        if summarizer is None and config.auxiliary.compression.model:
            from ctxengine.summarize.llm import LlmSummarizer

            summarizer = LlmSummarizer.from_config(config.auxiliary.compression)
        return cls(
            store=store,
            context_length=context_length,
            threshold=c.threshold,
            fresh_tail_messages=c.fresh_tail_messages,
            fresh_tail_ratio=c.fresh_tail_ratio,
            condense_after=c.condense_after,
            leaf_target_tokens=c.leaf_target_tokens,
            leaf_chunk_tokens=c.leaf_chunk_tokens,
            leaf_fact_tokens=c.leaf_fact_tokens,
            summarizer=summarizer,
            counter=services.get("counter"),
        )

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
        return self.counter.count_messages(messages) >= self.threshold_tokens > 0

    # -- compaction ---------------------------------------------------------------------------------
    def compress(self, messages: list[Message], current_tokens: int | None = None, focus_topic: str | None = None) -> list[Message]:
        """Fold the oldest spans outside the fresh tail into summary nodes (see the module doc).

        Always returns a new list; when nothing can be folded it equals the input.
        """
        t0 = time.perf_counter()
        msgs = list(messages)
        before = self.counter.count_messages(msgs)
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
        out_middle: list[Message] = []
        replaced: list[int] = []
        notes: list[str] = []
        self._hows = []
        self._fact_cache = {}
        # fold runs of originals (the latest user message is a barrier and stays verbatim)
        layer: list[_Item | Message] = []
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
        layer = self._condense(layer, focus_topic, notes)
        # summaries of what happened after the latest user message read as the assistant's own
        # account, so that message stays the last user-role message of the request
        role = "user"
        for entry in layer:
            if isinstance(entry, _Item):
                out_middle.append(entry.message if entry.message is not None else {"role": role, "content": entry.text})
            else:
                out_middle.append(entry)
                if latest_user >= 0 and entry is msgs[latest_user]:
                    role = "assistant"
        tail = [tail_cuts.get(i, msgs[i]) for i in range(tail_start, len(msgs))]
        replaced.extend(i for i in tail_cuts if i >= tail_start)
        out = [*msgs[:head], *out_middle, *tail]
        after = self.counter.count_messages(out)
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
        """Tool outputs larger than the whole fresh-tail budget, cut to their first and last
        lines (plus the paths, URLs and error lines of the cut part) before they are sent; each
        cut output is a one-message node, so ``lcm_expand`` returns it whole.

        A single recursive listing of 100K tokens would otherwise keep the request over the
        window however much older history is folded.
        """
        limit = int(self.context_length * self.fresh_tail_ratio)
        cuts: dict[int, Message] = {}
        sizes = [self.counter.count_messages([m]) if m.get("role") == "tool" and not is_summary(m) else 0 for m in msgs]
        giant = [i for i, t in enumerate(sizes) if t > limit]
        if not giant:
            return cuts
        parts = {i: _head_tail(content_text(msgs[i].get("content")), max(200, limit // 4)) for i in giant}
        # every fact of the cut parts shown, unless that alone would overflow the window
        others = self.counter.count_messages(msgs) - sum(sizes[i] for i in giant)
        cut_facts = extract_facts([{"role": "tool", "tool_call_id": "cut", "content": parts[i][1]} for i in giant])
        tight = others + sum(estimate(f) + 2 for f in cut_facts.all()) > self.context_length
        budget = min(self.leaf_fact_tokens, self.context_length // 16) if tight else self.leaf_fact_tokens
        for i in giant:
            m = msgs[i]
            tokens = sizes[i]
            children = [("message", ids[i])]
            nid = _node_id(0, children)
            text = self._existing(nid)
            if text is None:
                kept, cut_part = parts[i]
                facts = digest([{"role": "tool", "tool_call_id": "cut", "content": cut_part}], 0, budget)
                text = (
                    f"[ctxengine:lcm node={nid} depth=0] Output of {tokens:,} tokens cut to its first and last lines; "
                    f'the original is kept verbatim. Expand for details: lcm_expand(node_id="{nid}") returns it whole, '
                    f"lcm_grep searches it.\n{kept}" + (f"\nIn the cut part:\n{facts}" if facts else "")
                )
                self.store.add_node(self.session_id, nid, depth=0, text=text, children=children, meta={"messages": 1, "tokens": tokens, "summarizer": "cut"})
            cuts[i] = {**m, "content": text}
        return cuts

    def _tail_start(self, msgs: list[Message], units: list[tuple[int, int]]) -> int:
        """First index of the fresh tail: whole units from the end, at most
        ``fresh_tail_messages`` messages and ``fresh_tail_ratio`` of the window, at least one unit."""
        budget = int(self.context_length * self.fresh_tail_ratio)
        count = 0
        tokens = 0
        start = len(msgs)
        for s, e in reversed(units):
            t = self.counter.count_messages(msgs[s:e])
            if start < len(msgs) and (count + (e - s) > self.fresh_tail_messages or tokens + t > budget):
                break
            count += e - s
            tokens += t
            start = s
        return start

    def _chunks(self, msgs: list[Message], run: list[_Item]) -> list[list[_Item]]:
        chunks: list[list[_Item]] = []
        cur: list[_Item] = []
        size = 0
        for it in run:
            t = self.counter.count_messages(msgs[it.start : it.end])
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
        nid = _node_id(0, children)
        text = self._existing(nid)
        span_tokens = self.counter.count_messages(span)
        if text is None:
            header = _header(nid, 0, len(span), len(span))
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
            return digest(span, target, self._fact_budget()), "extractive-after-llm"
        return digest(span, target, self._fact_budget(), facts=self._facts(span)), "extractive"

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
        kept = self.counter.count_messages([m for m in msgs if id(m) not in folded])
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
        nid = _node_id(depth, children)
        text = self._existing(nid)
        if text is None:
            originals: list[Message] = []
            for it in group:
                originals.extend(m for _, m in self.store.node_messages(str(it.node_id)))
            header = _header(nid, depth, len(originals), len(group))
            body, how = self._summarize(originals, self.counter.count_messages(originals), focus_topic)
            self._hows.append(how)
            text = f"{header}\n{body}" if body else header
            self.store.add_node(self.session_id, nid, depth=depth, text=text, children=children, meta={"messages": len(originals), "summarizer": how})
        return _Item(group[0].start, group[-1].end, nid, depth, text)

    # -- tools -------------------------------------------------------------------------------------
    def get_tool_schemas(self) -> list[dict[str, Any]]:
        return [
            {
                "name": "lcm_grep",
                "description": (
                    "Search the full original conversation (including everything summarized away) and the "
                    "summaries. Returns matching lines verbatim with message and summary node ids."
                ),
                "parameters": {
                    "type": "object",
                    "properties": {
                        "query": {"type": "string", "description": "Text to find (case-insensitive), or a regular expression with mode=regex."},
                        "mode": {"type": "string", "enum": ["text", "regex"], "description": "text (default) or regex."},
                        "scope": {"type": "string", "enum": ["session", "all"], "description": "This session (default) or every stored session."},
                        "limit": {"type": "integer", "minimum": 1, "maximum": 100, "description": f"Most results to return (default {GREP_DEFAULT_LIMIT})."},
                    },
                    "required": ["query"],
                },
            },
            {
                "name": "lcm_describe",
                "description": "Show a summary node: depth, size, parents and children (messages or lower summaries) with previews.",
                "parameters": {
                    "type": "object",
                    "properties": {"node_id": {"type": "string", "description": "The id from a [ctxengine:lcm node=...] summary."}},
                    "required": ["node_id"],
                },
            },
            {
                "name": "lcm_expand",
                "description": "Return the original messages under a summary node, verbatim and in order, within a token budget (page with offset).",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "node_id": {"type": "string", "description": "The id from a [ctxengine:lcm node=...] summary."},
                        "max_tokens": {"type": "integer", "minimum": 100, "description": f"Token budget of the answer (default {EXPAND_DEFAULT_TOKENS})."},
                        "offset": {"type": "integer", "minimum": 0, "description": "Index of the first message to return (default 0)."},
                    },
                    "required": ["node_id"],
                },
            },
        ]

    def handle_tool_call(self, name: str, args: Mapping[str, Any], **kwargs: Any) -> str:
        """Run ``lcm_grep``, ``lcm_describe`` or ``lcm_expand``; errors come back as ``{"error": ...}``."""
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                return json.dumps({"error": f"{name}: arguments are not JSON"})
        if not isinstance(args, Mapping):
            return json.dumps({"error": f"{name}: arguments must be an object"})
        try:
            if name == "lcm_grep":
                return json.dumps(self.grep(**_pick(args, "query", "mode", "scope", "limit")), ensure_ascii=False)
            if name == "lcm_describe":
                return json.dumps(self.describe(**_pick(args, "node_id")), ensure_ascii=False)
            if name == "lcm_expand":
                return json.dumps(self.expand(**_pick(args, "node_id", "max_tokens", "offset")), ensure_ascii=False)
        except TypeError as exc:
            return json.dumps({"error": f"{name}: bad arguments: {exc}"})
        except CtxEngineError as exc:
            return json.dumps({"error": f"{name}: {exc}"})
        return json.dumps({"error": f"Unknown tool: {name}"})

    def grep(self, query: str, mode: str = "text", scope: str = "session", limit: int = GREP_DEFAULT_LIMIT) -> dict[str, Any]:
        """``lcm_grep``: search originals and summaries; snippets are verbatim."""
        if scope not in ("session", "all"):
            raise InputError(f"scope must be 'session' or 'all', not {scope!r}")
        limit = max(1, min(100, int(limit)))
        hits = self.store.search(query, session_id=self.session_id if scope == "session" else None, mode=mode, limit=limit)
        results = [h.to_dict() for h in hits]
        for r in results:
            if r["kind"] == "message" and len(r["message_ids"]) > 3:
                r["message_ids"] = r["message_ids"][:3]
        return {"query": query, "scope": scope, "count": len(results), "results": results}

    def describe(self, node_id: str) -> dict[str, Any]:
        """``lcm_describe``: a node's metadata, parents and children with previews."""
        node = self.store.get_node(str(node_id))
        msg_ids = [cid for kind, cid in node.children if kind == "message"]
        previews = dict(zip(msg_ids, self.store.get_messages(msg_ids), strict=True)) if msg_ids else {}
        children = []
        for kind, cid in node.children:
            if kind == "message":
                m = previews[cid]
                children.append({"kind": "message", "id": cid, "role": m.get("role"), "preview": _preview(message_text(m))})
            else:
                child = self.store.get_node(cid)
                body = child.text.split("\n", 1)[1] if "\n" in child.text else ""
                children.append({"kind": "node", "id": cid, "depth": child.depth, "preview": _preview(body)})
        return {
            "id": node.id,
            "session_id": node.session_id,
            "depth": node.depth,
            "tokens": node.tokens,
            "meta": node.meta,
            "parents": node.parents,
            "children": children,
        }

    def expand(self, node_id: str, max_tokens: int = EXPAND_DEFAULT_TOKENS, offset: int = 0) -> dict[str, Any]:
        """``lcm_expand``: the originals under a node, verbatim, from ``offset`` within ``max_tokens``.

        At least one message is returned; one larger than the whole budget comes back whole
        only if it fits ``max_tokens`` × 4, else its text is cut and ``truncated`` says so.
        """
        pairs = self.store.node_messages(str(node_id))
        offset = max(0, int(offset))
        budget = max(100, int(max_tokens))
        out: list[dict[str, Any]] = []
        used = 0
        i = offset
        truncated = False
        while i < len(pairs):
            mid, m = pairs[i]
            t = self.counter.count_messages([m])
            if out and used + t > budget:
                break
            if not out and t > budget * 4:
                text = message_text(m)
                m = {**m, "content": text[: budget * 4]}
                truncated = True
            out.append({"id": mid, "message": m})
            used += t
            i += 1
        return {
            "node_id": node_id,
            "total": len(pairs),
            "offset": offset,
            "next_offset": i if i < len(pairs) else None,
            "truncated": truncated,
            "messages": out,
        }

    def retrievable(self, fact: str) -> bool:
        """True when ``lcm_grep`` over this session returns ``fact`` verbatim (DESIGN §3.3 #8:
        a fact not in the context must be retrievable from the store)."""
        hits = self.store.search(fact, session_id=self.session_id, limit=5)
        return any(fact in h.snippet for h in hits)

    def get_status(self) -> dict[str, Any]:
        status = super().get_status()
        status["session_id"] = self.session_id
        return status


def _head_tail(text: str, tokens: int) -> tuple[str, str]:
    """The first and last lines of ``text`` within about ``tokens`` (two thirds head, one third
    tail; long lines cut to 300 characters), with a marker line; and the cut middle."""
    lines = text.splitlines()
    budget = tokens * 4
    head: list[str] = []
    used = 0
    for line in lines:
        line = line[:300]
        if used + len(line) > budget * 2 // 3:
            break
        head.append(line)
        used += len(line) + 1
    tail: list[str] = []
    used = 0
    for line in reversed(lines[len(head) :]):
        line = line[:300]
        if used + len(line) > budget // 3:
            break
        tail.append(line)
        used += len(line) + 1
    tail.reverse()
    middle = lines[len(head) : len(lines) - len(tail)]
    kept = "\n".join([*head, f"[... {len(middle):,} lines cut ...]", *tail])
    return kept, "\n".join(middle)


def _pick(args: Mapping[str, Any], *names: str) -> dict[str, Any]:
    unknown = sorted(set(args) - set(names))
    if unknown:
        raise TypeError(f"unexpected argument(s) {', '.join(unknown)}")
    return {k: args[k] for k in names if k in args}


def _preview(text: str) -> str:
    one = " ".join(text.split())
    return one if len(one) <= _PREVIEW else one[: _PREVIEW - 1] + "…"


def _quoted_users(span: Sequence[Message], text: str) -> str:
    """User messages of ``span`` that ``text`` does not quote verbatim, as quote lines."""
    lines = []
    for m in span:
        if m.get("role") == "user" and not is_summary(m):
            t = content_text(m.get("content"))
            if t and t not in text:
                lines.append(f"User: {t}")
    return "\n".join(lines)


def digest(span: Sequence[Message], budget_tokens: int, fact_tokens: int = 4000, *, facts: Facts | None = None) -> str:
    """The deterministic digest of a span.

    User messages verbatim (always: they are the task); then the preservation facts — tool
    names, error lines, file paths, URLs — verbatim while they fit ``fact_tokens``; then
    assistant excerpts while the whole stays within ``budget_tokens``. Facts beyond
    ``fact_tokens`` (a recursive listing of thousands of paths) are counted, not shown: they
    stay one ``lcm_grep`` away, which is what keeps a fold of such an output small.
    """
    if facts is None:
        facts = extract_facts([m for m in span if not is_summary(m)])
    lines: list[str] = []
    for m in span:
        if m.get("role") == "user" and is_summary(m):
            # an earlier summary folded again (from another engine): keep its first line
            lines.append("Earlier summary: " + content_text(m.get("content")).split("\n", 1)[0][:300])
    # every user text verbatim, even blank ones (the anchors rule quotes them exactly)
    users = dict.fromkeys(content_text(m.get("content")) for m in span if m.get("role") == "user" and not is_summary(m))
    lines += [f"User: {u}" for u in users if u]
    used = sum(estimate(ln) + 1 for ln in lines)
    excerpts = []
    for m in span:
        if m.get("role") == "assistant":
            first = next((ln.strip() for ln in content_text(m.get("content")).splitlines() if ln.strip()), "")
            if first:
                excerpts.append(first[:200])
    sections = [
        ("Tools", facts.tools, ", "),
        ("Errors", facts.errors, None),
        ("Files", facts.paths, ", "),
        ("URLs", facts.urls, ", "),
        ("Assistant", excerpts, None),
    ]
    omitted: list[str] = []
    fact_used = 0
    for title, items, sep in sections:
        if not items:
            continue
        kept: list[str] = []
        for item in items:
            cost = estimate(item) + 2
            if title == "Assistant":
                if used + cost + 8 > budget_tokens:
                    break
            elif fact_used + cost > fact_tokens:
                break
            else:
                fact_used += cost
            kept.append(item)
            used += cost
        if kept:
            if sep is None:
                lines.append(f"{title}:")
                lines += [f"- {k}" for k in kept]
            else:
                lines.append(f"{title}: {sep.join(kept)}")
        if len(kept) < len(items):
            omitted.append(f"{len(items) - len(kept)} {title.lower()}")
    if omitted:
        lines.append(f"[not shown here: {', '.join(omitted)} — use lcm_grep or lcm_expand]")
    return "\n".join(lines)
