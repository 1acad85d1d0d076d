"""The shared kit every engine builds on (DESIGN §3.9): engines are policies, the kit holds
the mechanics once.

* :mod:`~ctxengine.engines.kit.cut` — cut one output to a budget (head + tail + facts, one
  marker naming the recall ref);
* :mod:`~ctxengine.engines.kit.blocks` — fact blocks: render, parse, fit to a budget;
* :mod:`~ctxengine.engines.kit.records` — the ``[ctxengine:`` record namespace (one owner);
* :mod:`~ctxengine.engines.kit.cutpolicy` — the cache-aware cut policy (giant outputs, batches
  that pay for the cache they invalidate, the cut-first trial), a mixin for an engine;
* :mod:`~ctxengine.engines.kit.trigger` — when a summarizing engine on that policy compacts
  (threshold, back-off, no thrash, what the cache reads);
* :mod:`~ctxengine.engines.kit.calls` — tool calls in records: previews, elided arguments;
* :mod:`~ctxengine.engines.kit.nodes` — summary nodes over the store: the store protocol,
  node headers;
* also :mod:`~.digest`, :mod:`~.tail`, :mod:`~.pacing`, :mod:`~.originals`, :mod:`~.build`.
"""

from __future__ import annotations

from ctxengine.engines.kit.blocks import (
    FACTS_HEADER,
    fit_facts,
    parse_facts_block,
    render_facts,
    split_facts_block,
    unseen,
)
from ctxengine.engines.kit.cut import LINE_CHARS, cut_output
from ctxengine.engines.kit.records import (
    EXPAND_TOOL,
    MARK,
    Marker,
    RecallReach,
    call_of,
    header,
    is_marked,
    is_marked_text,
    parse_header,
    recall_pointer,
)

__all__ = [
    "EXPAND_TOOL",
    "FACTS_HEADER",
    "LINE_CHARS",
    "MARK",
    "Marker",
    "RecallReach",
    "call_of",
    "cut_output",
    "fit_facts",
    "header",
    "is_marked",
    "is_marked_text",
    "parse_facts_block",
    "parse_header",
    "recall_pointer",
    "render_facts",
    "split_facts_block",
    "unseen",
]
