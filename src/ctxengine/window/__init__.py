"""The window cap: no request leaves the manager larger than the window, whatever the engine did.

The limit of one request is::

    limit = context_length − completion_reserve − window_margin × context_length

* ``completion_reserve`` (``context.completion_reserve``) keeps room for the model's answer.
  Default ``min(8192, context_length // 16)``: 2,000 tokens at 32K, 8,000 at 128K, 8,192 from
  about 131K up — what agents usually ask for as ``max_tokens``.
* ``window_margin`` (``context.window_margin``, default 3 % of the window) absorbs the
  difference between o200k, which the cap counts with, and a provider's own tokenizer.

Counting (:class:`WindowCounter`): the cap counts every message with the o200k tokenizer,
memoised per text, so a long session costs one exact count per new text (the estimate is 16 %
low on a ``/sys`` listing in the data, 20 % on mixed Unicode, 60 % on base64: no estimate is
trusted at the limit). A text not tokenized yet is first taken at a safe upper bound (its
UTF-8 byte count: an o200k token is never shorter than a byte) and tokenized only when the
request with these bounds is not under the limit. Each
session keeps running sums (:class:`WindowTally`): a list that extends the last one measured
costs only its new messages, and the same list measured again (``request`` after ``prepare``)
costs nothing. For the engines' decisions the manager's session counter estimates short texts
and counts texts of :data:`EXACT_CHARS` characters or more exactly.

When the request is over (:meth:`WindowCap.fit`), the cap cuts, in this order (no tool pair
breaks; no user message is lost: one stubbed or folded stays in the store, returned by recall):

1. the largest tool outputs, then the largest assistant texts and marked summaries, each with
   :func:`ctxengine.engines.kit.cut.cut_output` (head + tail lines, a ``[ctxengine:cut ref=…]``
   marker naming the original's store id, the paths, URLs and error lines of the removed middle
   as far as the budget allows); a message is cut to what the excess requires plus 5 % of the
   limit of headroom, so the next turns do not cut again by a few tokens each;
2. oversized tool-call arguments (the arguments become a JSON object holding the cut text);
3. older user messages become recall stubs (a cut with their ``ref``), oldest first;
   with recall (a store), then every older user message down to its marker alone. Only when
   their originals are kept: without a store (no ``ref_for``), no user message, and no summary
   that quotes one, is ever cut (there is no other copy), so a request that fits only that way
   is a :class:`~ctxengine.errors.ContextWindowError` saying so;
4. whole old exchanges (an assistant message and its tool results), oldest first, never the
   last one (only when the messages alone, each cut to its marker, overflow: thousands of
   turns in a small window);
5. with recall, the oldest messages left before the latest user message (stubs, markers,
   records) fold into one ``[ctxengine:folded: …]`` line pointing at recall, as few as needed;
6. if the system prompt and the latest user message alone do not fit, it raises
   :class:`~ctxengine.errors.ContextWindowError` naming the sizes: nothing valid can be sent.

**Tool definitions** count too (the provider counts them in the prompt): ``over`` and ``fit``
take ``reserve``, the tokens a request carries besides its messages (the serialised tool
schemas, :class:`ToolTokens`), and hold the messages to ``limit - reserve``.

By concern: :mod:`~ctxengine.window.counting` (the limit, the counters, the tool definitions'
size, the running sums), :mod:`~ctxengine.window.cap` (:class:`WindowCap`: measure, ``over``,
``room``, ``fit``), :mod:`~ctxengine.window.fitting` (the cuts above, in their order).

The originals are in the session store (the manager records every message each turn), so
everything cut stays retrievable verbatim through recall (:mod:`ctxengine.recall`). Without a
store the cut keeps the facts it can list, the marker has no ``ref``, and only outputs and the
engine's own texts are cut.
"""


from __future__ import annotations

from ctxengine.window.cap import WindowCap
from ctxengine.window.counting import (
    _MEMO_SIZE,
    _TOOL_IDS,
    _TOOL_IDS_BYTES,
    _TOOL_MEMO_SIZE,
    EXACT_CHARS,
    TOOLS_OVERHEAD_TOKENS,
    ExactView,
    ToolTokens,
    WindowCounter,
    WindowLimit,
    WindowTally,
    default_completion_reserve,
)
from ctxengine.window.fitting import CapResult, Fitting, RefFor

__all__ = [
    "EXACT_CHARS",
    "TOOLS_OVERHEAD_TOKENS",
    "CapResult",
    "ExactView",
    "Fitting",
    "RefFor",
    "ToolTokens",
    "WindowCap",
    "WindowCounter",
    "WindowLimit",
    "WindowTally",
    "default_completion_reserve",
]

__all__ += ["_MEMO_SIZE", "_TOOL_IDS", "_TOOL_IDS_BYTES", "_TOOL_MEMO_SIZE"]  # bounds the tests read
