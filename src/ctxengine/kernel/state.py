"""What the kernel's stages share: a session's state, the model's window, and the quick turn's
refusal (:class:`CompactionDue`).

Every stage takes the :class:`SessionState` it works on as an argument and the
:class:`ModelWindow` at construction; neither knows the facade (:mod:`ctxengine.manager`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxengine.caching import CachePace
from ctxengine.engine import ContextEngine
from ctxengine.engines.kit.pacing import Streak
from ctxengine.engines.kit.records import RecallReach
from ctxengine.errors import CtxEngineError
from ctxengine.history import SessionHistory
from ctxengine.messages import Message
from ctxengine.models import ModelProfile
from ctxengine.recall import Recall
from ctxengine.storage import NodeStage
from ctxengine.tokens import AnchoredCounter
from ctxengine.window import WindowTally

__all__ = ["CompactionDue", "HeldNow", "ModelWindow", "SessionState"]


class CompactionDue(CtxEngineError):
    """``prepare(..., may_compact=False)`` would do more than map the input and append it: a
    compaction, a window cut, an engine reset, tool calls to answer, a store write now, or it
    would wait for the session's lock (``reason`` says which). Raised before the session
    changed; the same call with ``may_compact=True`` does the turn.

    ``local``: what is due is work of this process alone (the engine's or session hygiene's
    compaction, the window cap's cut), not a store read or write now, tool calls to answer
    or a wait for the session's lock; ``tokens`` is then the turn's count of its messages
    (tool definitions aside): what that work goes through."""

    def __init__(self, reason: str, *, local: bool = False, tokens: int = 0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.local = local
        self.tokens = tokens


class HeldNow:
    """``lock`` held for the block, or :class:`CompactionDue` when taking it would wait.

    A class rather than a generator context manager: the quick turn enters one twice, and
    each generator-based one costs a generator and its frames (~4K instructions)."""

    __slots__ = ("_lock",)

    def __init__(self, lock: threading.RLock) -> None:
        self._lock = lock

    def __enter__(self) -> None:
        if not self._lock.acquire(blocking=False):
            raise CompactionDue("another call holds the session")

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


@dataclass
class ModelWindow:
    """The model a manager serves and its window, shared by the stages: the window can change
    at run time (``ContextManager.set_context_length``); ``version`` counts the changes, so a
    session's engine is told the new window at the start of its next call."""

    model: str
    profile: ModelProfile
    version: int = 0

    @property
    def context_length(self) -> int:
        return self.profile.context_length

    @property
    def source(self) -> str:
        return self.profile.window_source


@dataclass
class SessionState:
    """Everything the kernel keeps for one session between two calls (under ``lock``)."""

    id: str
    engine: ContextEngine
    counter: AnchoredCounter
    lock: threading.RLock = field(default_factory=threading.RLock)
    started: bool = False
    hygiene_armed: bool = True
    hygiene_fired: int = 0
    compactions: int = 0
    turns: int = 0
    last_sent: list[Message] = field(default_factory=list)
    last_request: list[Message] | None = None
    last_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    prompt_tokens_total: int = 0
    pressure_warning: str | None = None
    store_errors: int = 0
    engine_errors: int = 0
    last_compaction: dict[str, Any] | None = None
    recall: Recall | None = None
    # whether the recall tools reach the model (prepare(recall=...)); the session's engine
    # holds the same object (Services.reach), so its markers and the window cap's agree
    reach: RecallReach = field(default_factory=RecallReach)
    # the nodes a compaction of the engine wrote, stored with its record (Services.nodes)
    nodes: NodeStage = field(default_factory=NodeStage)
    lost: bool = False
    streak: Streak = field(default_factory=Streak)  # compactions on consecutive turns (the rest after MAX_CONSECUTIVE)
    window_cuts: int = 0
    fallback_reason: str | None = None
    history: SessionHistory = field(default_factory=SessionHistory)
    pending: Callable[[], list[str] | None] | None = None  # a turn's deferred recording (prepare(defer_record=True))
    defer_writes: bool = False  # this turn's caller defers its store writes (its compaction's record too)
    tally: WindowTally = field(default_factory=WindowTally)  # the window cap's running sums
    pace: CachePace = field(default_factory=CachePace)  # cache_ttl: auto (caching.CachePace)
    # what the last prepared request carries besides its messages (tool definitions): the
    # decisions' count and the window cap's (o200k); update_from_response takes the first out
    # of the provider's prompt tokens, which include it
    tool_tokens: int = 0
    tool_window: int = 0
    # the agent's tool list the last prepare was given (what request() prepares unseen messages with)
    agent_tools: Sequence[Mapping[str, Any]] | None = None
    window_version: int = 0  # the manager's window this session's engine was told (set_context_length)
