"""What one API adds to the shared request flow (see :mod:`.handler`): its checks, its 400
body, its reply body and the SSE events that stream that reply."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from .task import Reply
from .validate import Rejection

if TYPE_CHECKING:
    from .server import StrictUpstream


class Api(Protocol):
    name: str  # "chat" | "messages" | "responses", as the script and the stats name it

    def validate(self, up: StrictUpstream, body: dict[str, Any]) -> Rejection | None:
        """(reason, provider message) of a rejection, or None."""
        ...

    def error(self, up: StrictUpstream, reason: str, message: str, tokens: int) -> dict[str, Any]:
        """The provider's 400 body for a rejection (``over_window`` words its own message)."""
        ...

    def build(
        self, up: StrictUpstream, reply: Reply, model: str, tokens: int, body: dict[str, Any]
    ) -> dict[str, Any]:
        """The reply as the provider's non-streamed JSON body."""
        ...

    def events(self, payload: dict[str, Any], body: dict[str, Any]) -> list[bytes]:
        """The SSE events that stream ``payload`` (what :meth:`build` returned)."""
        ...
