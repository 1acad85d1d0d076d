"""Summary nodes over the session store: what an engine that keeps them needs.

A node engine (``lcm``) folds spans into summary nodes whose ids are content addresses
(:func:`~ctxengine.engines.kit.originals.node_id`) and whose text opens with a header that
names the node and the recall tools that expand it. What such an engine needs from a session
store is :class:`ctxengine.storage.NodeStore` (the store seam; re-exported here, engines never
import the store), :func:`node_text_header` the header line.
"""

from __future__ import annotations

from ctxengine.engines.kit.records import node_header
from ctxengine.storage import NodeStore

__all__ = ["NodeStore", "node_text_header"]


def node_text_header(nid: str, depth: int, n_messages: int, n_children: int) -> str:
    """The first line of node ``nid``'s text: what it summarizes (``n_messages`` originals, in
    ``n_children`` summaries above depth 0) and how to get the originals back."""
    what = f"{n_messages} earlier messages" if depth == 0 else f"{n_children} summaries of {n_messages} earlier messages"
    return (
        f"{node_header(nid, depth)} Summary of {what}; the originals are kept verbatim. "
        f'Expand for details: lcm_expand(node_id="{nid}") returns them, lcm_describe shows the node, '
        "lcm_grep searches every original."
    )
