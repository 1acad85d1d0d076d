"""Summary nodes over the session store: what an engine that keeps them needs.

A node engine (``lcm``) folds spans into summary nodes whose ids are content addresses
(:func:`~ctxengine.engines.kit.originals.node_id`) and whose text opens with a header that
names the node and the recall tools that expand it. :class:`NodeStore` is what such an engine
needs from a session store (``ctxengine.store`` backends provide it; engines never import
the store), :func:`node_text_header` the header line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from ctxengine.engines.kit.records import node_header
from ctxengine.messages import Message

__all__ = ["NodeStore", "node_text_header"]


@runtime_checkable
class NodeStore(Protocol):
    """What a node engine needs from a session store (``ctxengine.store`` backends provide it)."""

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


def node_text_header(nid: str, depth: int, n_messages: int, n_children: int) -> str:
    """The first line of node ``nid``'s text: what it summarizes (``n_messages`` originals, in
    ``n_children`` summaries above depth 0) and how to get the originals back."""
    what = f"{n_messages} earlier messages" if depth == 0 else f"{n_children} summaries of {n_messages} earlier messages"
    return (
        f"{node_header(nid, depth)} Summary of {what}; the originals are kept verbatim. "
        f'Expand for details: lcm_expand(node_id="{nid}") returns them, lcm_describe shows the node, '
        "lcm_grep searches every original."
    )
