"""The engine contract kit: property-test any :class:`ContextEngine` against DESIGN §3.3.

One call does it::

    from ctxengine.testing import check_engine_contract

    def test_my_engine_keeps_the_contract():
        report = check_engine_contract(lambda: MyEngine(context_length=4_000))
        assert report.turn_compactions > 0

Pass a *factory* (a callable returning a fresh engine) with a small ``context_length`` so
that compaction really fires on the generated conversations; an engine instance works too (it
is reset with ``on_session_reset()`` between examples). The kit draws conversations from
:func:`ctxengine.testing.strategies.conversations` (sized relative to the engine's threshold)
and, for each one:

* calls ``compress`` on the whole conversation (a forced compaction, as a manual ``/compress``
  does), and
* replays it as an agent loop: before every assistant message the working context goes
  through the per-turn path (``should_compress(tokens)`` → ``compress`` when it says so), the
  engine is told the usage of the request (``update_from_response``), and the next messages
  are appended to what was sent.

It checks, on every ``compress`` call (``W`` the input, ``O`` the output):

1. **Valid in, valid out** — ``validate(O)`` reports no error (every call keeps exactly one
   result, no orphan results, legal roles); ``compress`` returns a list and does not raise.
2. **No mutation** — ``W`` serializes to the same bytes before and after; ``O is not W``.
3. **Under the threshold nothing changes** — on the per-turn path, while the request holds at
   most half of ``threshold_tokens`` (margin for engines that count with another tokenizer),
   ``should_compress`` is False, so the request goes out unchanged.
4. **No fabrication** — every message of ``O`` is accounted for. It is either
   *verbatim* (equal to a message of ``W``); or *marked* (:func:`ctxengine.messages.is_summary`:
   its text starts with ``[CONTEXT COMPACTION]`` or ``[ctxengine:``; engines write summaries,
   folded spans and records this way); or a *placeholder result* (a ``tool`` message whose
   ``tool_call_id`` is that of a tool message of ``W``: a stub, a cut output, a one-line
   record — any content); or a *reduced call* (an assistant message whose tool calls, by id
   and function name, all belong to one assistant message of ``W``); or a *reduced message*
   (role of a message of ``W``). For reduced calls and reduced messages every non-empty line
   of the text must occur in the text of ``W`` (cut or merged text), except short annotation
   lines in square brackets (``[...truncated 40 lines...]``, at most 500 characters).
5. **Anchors survive** — a leading system prompt stays the first message and keeps its text
   (a note may be appended); every user message of ``W`` is in ``O`` verbatim, or its text is
   quoted verbatim (leading and trailing whitespace aside) inside a marked summary (folding
   older user turns is allowed; their images are not checked), or, for an older one, the
   engine's ``retrievable(text)`` returns it verbatim (a long pasted message quoted briefly,
   its original in the store, as invariant 8 allows for facts); the latest user message is
   always in ``O`` verbatim. After the replay, every user message of the conversation passes
   the same test against the last request.
6. **Deterministic engines are deterministic** (``engine.deterministic`` is True) — two fresh
   engines give byte-identical outputs for the forced compaction and for every request of the
   replay.
7. **Prefix stability** — let compaction *k* turn ``W_k`` into ``O_k`` and the next one turn
   ``W_j = O_k + appended`` into ``O_j``. The messages compaction *k* wrote (those of ``O_k``
   that are not in ``W_k`` verbatim: cut outputs, records, a note on the system prompt) are
   final: each must still be in ``O_j`` byte for byte (JSON, key order included). The one
   exception is a fold: when the first message of ``O_j`` that differs from ``O_k`` is a marked
   summary (not a tool result), the span from there on was folded into a summary in one batch
   (iterative summaries update themselves this way), and anything after it may change.
   Editing already-compacted messages in place is what is forbidden: they are read from the
   prompt cache, and re-editing them costs a cache write of everything after them each time.
   Not checked while the system prompt and user messages alone overflow the window.
8. **Preservation guarantee** (deterministic engines) — the facts of ``W``
   (:func:`ctxengine.facts.extract_facts`: user texts, file paths, URLs, tool names, error
   lines) all occur in the text of ``O``; after the replay, the facts of the whole
   conversation occur in the last request. An engine that keeps originals in a store may
   define ``retrievable(fact: str) -> bool``: a fact missing from the text counts as kept
   when it returns True ("or retrievable verbatim from the store"). Exception: when ``O`` plus the missing facts
   would not fit in ``context_length`` (a giant output, or user messages that alone fill the
   window), the facts may live in a store instead (DESIGN §3.8); the report counts them as
   ``facts_beyond_window``.

Then the kernel's guarantees (DESIGN §3.9), which hold for any engine once it runs inside
:class:`~ctxengine.ContextManager` (``kernel=True``, the default):

10. **Window held** — each conversation is replayed through a manager serving the engine
    (:func:`ctxengine.loop.replay`, an in-memory SQLite store): every request, counted with
    the o200k tokenizer, is within the window minus the completion reserve and margin.
11. **Removed facts retrievable** — after that replay every fact of the conversation is in
    the last request or returned verbatim by recall (:meth:`ContextManager.retrievable`).
12. **No thrash** — on a session whose second tool output alone is about three windows, the
    engine (its own trigger, no kernel guard) compacts on at most 3 consecutive turns.

A broken invariant raises :class:`ContractViolation` (an ``AssertionError``) naming the
invariant, the engine and the problem, with the smallest example hypothesis could shrink to.
Invariant 9 of DESIGN §3.3 (failure never loses context) needs a failing summarizer and is
tested per engine, not here.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextlib import nullcontext

from hypothesis import HealthCheck, Phase, Verbosity, given
from hypothesis import seed as hypothesis_seed
from hypothesis import settings as hypothesis_settings
from hypothesis.strategies import SearchStrategy

from ctxengine.messages import Message
from ctxengine.testing.contract_report import (
    INVARIANTS,
    MAX_ANNOTATION_CHARS,
    ContractReport,
    ContractViolation,
    EngineSource,
    show_messages,
)
from ctxengine.testing.harness import Harness, giant_output_session
from ctxengine.testing.hypothesis_pins import no_local_constants, shrink_limit
from ctxengine.testing.strategies import conversations

__all__ = ["INVARIANTS", "ContractReport", "ContractViolation", "EngineSource", "check_engine_contract"]

# The kit's parts live in contract_report (vocabulary), harness (the checks) and hypothesis_pins;
# these names stay importable from here as they always were.
_Harness = Harness
_REEXPORTED = (MAX_ANNOTATION_CHARS, show_messages, giant_output_session)


def _property(harness: Harness, strategy: SearchStrategy[list[Message]], *, examples: int, seed: int | None, kernel: bool) -> Callable[[], None]:
    """The hypothesis test the kit runs: each drawn conversation through ``harness`` (and the
    kernel replay when ``kernel``), ``examples`` of them, quietly, with ``seed`` when given."""

    @hypothesis_settings(
        max_examples=examples,
        deadline=None,
        database=None,
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        phases=(Phase.explicit, Phase.generate, Phase.shrink),
    )
    @given(strategy)
    def prop(conv: list[Message]) -> None:
        harness.run(conv)
        if kernel:
            harness.kernel(conv)

    if seed is not None:
        prop = hypothesis_seed(seed)(prop)
    return prop


def check_engine_contract(
    engine: EngineSource,
    *,
    examples: int = 50,
    seed: int | None = 0,
    max_turns: int = 6,
    huge_tokens: int | None = None,
    shrink_seconds: float = 30.0,
    kernel: bool = True,
) -> ContractReport:
    """Property-test ``engine`` against the invariants of DESIGN §3.3 (see the module docs).

    ``engine``: a factory returning a fresh engine (preferred; give it a small
    ``context_length`` such as 4,000 so compaction fires), or an engine instance (reset with
    ``on_session_reset()`` between examples). ``examples``: conversations to generate.
    ``seed``: fixed by default so runs are reproducible (the same conversations in any process,
    whatever ran before); ``None`` for a fresh random run.
    ``max_turns``: user turns per conversation. ``huge_tokens``: size bound of the occasional
    huge tool output; default twice the engine's threshold (at least 500, at most 100,000), so
    a single output can cross the threshold as in real sessions. ``shrink_seconds``: time
    spent shrinking a failure to a smaller example before it is reported. ``kernel``: also
    replay each conversation through a ContextManager serving the engine (invariants 10, 11)
    and run the giant-output session (invariant 12); needs the ``exact`` extra.

    Returns a :class:`ContractReport`; raises :class:`ContractViolation` (an
    ``AssertionError``) naming the broken invariant with the smallest example found.
    """
    harness = Harness(engine)
    if huge_tokens is None:
        huge_tokens = max(500, min(2 * harness.threshold, 100_000))
    if harness.threshold <= 0:
        harness.report.notes.append("threshold_tokens is 0: invariant 3 (under the threshold) not checked")
    prop = _property(harness, conversations(max_turns=max_turns, huge_tokens=huge_tokens), examples=examples, seed=seed, kernel=kernel)
    pinned = no_local_constants() if seed is not None else nullcontext()
    with shrink_limit(shrink_seconds), pinned, warnings.catch_warnings():
        # hypothesis renders the failing conversation (tens of KB) for its own report, which
        # the kit replaces with a bounded rendering: its size warning is noise here
        warnings.filterwarnings("ignore", message="Generating overly large repr")
        prop()
    if kernel:
        harness.thrash()
    if harness.report.turn_compactions == 0:
        harness.report.notes.append(
            f"no compaction fired on the per-turn path (threshold {harness.threshold:,} tokens): "
            "give the engine a smaller context_length to exercise invariants 3 and 7"
        )
    return harness.report
