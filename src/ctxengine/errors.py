"""The exceptions ctxengine raises.

Every error the library raises on purpose derives from one root, so callers can catch
``CtxEngineError`` once. Foreign exceptions (JSON, YAML, HTTP SDKs, SQLite, psycopg) are
translated once, at the boundary where they occur, with ``raise ... from exc``::

    CtxEngineError
    ├── InvalidMessages        a message list breaks the chat format (carries .violations)
    ├── InputError             a file or payload cannot be read or parsed
    ├── ConfigError            bad configuration: unknown key, bad value, unknown engine
    ├── PluginError            a plugin failed to load or registered something invalid
    ├── EngineError            an engine broke its contract (names the broken rule), failed or timed out
    │   └── EngineStartError   an engine could not be built (also a PluginError)
    ├── ContextWindowError     a request cannot fit the window even with every output cut
    ├── SummarizerError        a summary could not be produced
    │   ├── SummarizerAuthError      credentials rejected (never retried)
    │   └── SummarizerContextError   the span does not fit the summarizer's window
    ├── TokenizerError         an exact tokenizer is unavailable or failed
    └── StoreError             the session store failed
        └── NotFoundError      a session, message or node id does not exist
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ctxengine.messages import Violation

__all__ = [
    "ConfigError",
    "ContextWindowError",
    "CtxEngineError",
    "EngineError",
    "EngineStartError",
    "InputError",
    "InvalidMessages",
    "NotFoundError",
    "PluginError",
    "StoreError",
    "SummarizerAuthError",
    "SummarizerContextError",
    "SummarizerError",
    "TokenizerError",
]


class CtxEngineError(Exception):
    """Root of every error ctxengine raises on purpose."""


class InvalidMessages(CtxEngineError, ValueError):
    """A message list breaks the chat format.

    ``violations`` lists every problem found (not just the first), each with the index of
    the offending message, so a caller can fix all of them in one go.
    """

    def __init__(self, violations: Sequence[Violation], context: str = "messages") -> None:
        self.violations = list(violations)
        shown = "; ".join(str(v) for v in self.violations[:10])
        more = len(self.violations) - 10
        if more > 0:
            shown += f"; … and {more} more"
        super().__init__(f"invalid {context}: {len(self.violations)} violation(s): {shown}")


class InputError(CtxEngineError, ValueError):
    """A file or payload could not be read or parsed."""


class ConfigError(CtxEngineError, ValueError):
    """The configuration is invalid (unknown key, bad value, unknown engine name)."""


class PluginError(CtxEngineError):
    """A plugin could not be loaded or registered something invalid."""


class EngineError(CtxEngineError):
    """An engine returned output that breaks the engine contract."""


class EngineStartError(EngineError, PluginError):
    """An engine could not be built: its plugin failed to import, or its constructor raised
    (names the engine and where it comes from)."""


class ContextWindowError(CtxEngineError, ValueError):
    """No valid request fits the window: the system prompt and the latest user message alone
    exceed it (or the configured reserve and margin leave no room)."""


class SummarizerError(CtxEngineError):
    """A summary could not be produced (transport error, empty or template-less reply).

    ``retryable`` says whether another attempt may succeed (429, 5xx, timeouts, resets, bad
    replies: yes; credentials, a prompt too long: no); ``retry_after`` is the wait in seconds
    the server asked for (``Retry-After``), if any. The summarizer's deadline caps both.
    """

    def __init__(self, message: str = "", *, retryable: bool = True, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after


class SummarizerAuthError(SummarizerError):
    """The summarizer endpoint rejected the credentials; retrying will not help."""

    def __init__(self, message: str = "", *, retryable: bool = False, retry_after: float | None = None) -> None:
        super().__init__(message, retryable=retryable, retry_after=retry_after)


class SummarizerContextError(SummarizerError):
    """The span to summarize does not fit the summarizer model's context window."""

    def __init__(self, message: str = "", *, retryable: bool = False, retry_after: float | None = None) -> None:
        super().__init__(message, retryable=retryable, retry_after=retry_after)


class TokenizerError(CtxEngineError):
    """An exact tokenizer could not be loaded or used."""


class StoreError(CtxEngineError):
    """The session store failed (I/O, schema, database errors)."""


class NotFoundError(StoreError, KeyError):
    """A session, message or summary node id does not exist."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "not found"
