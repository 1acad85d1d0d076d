"""Originals: where the text an engine removes lives, and how the agent gets it back.

The session store (handed to an engine in :class:`~ctxengine.engine.Services`) keeps every
original message; an engine records the context it compacts, names what a record stands for
with a content-addressed *node* (its id is the ``ref=`` of the record's marker, so
``ctx_expand ref=<id>`` returns the originals verbatim), and asks the store-backed
:class:`~ctxengine.recall.Recall` whether a fact it left out can be given back
(:meth:`Originals.retrievable`). Without a store there is no :class:`Originals`: engines keep
facts in context instead.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from ctxengine.engine import Services
from ctxengine.engines.kit.records import RecallReach, recall_pointer
from ctxengine.errors import NotFoundError
from ctxengine.messages import Message
from ctxengine.recall import Recall
from ctxengine.storage import NodeBatchStore, NodeSpec, NodeStage
from ctxengine.tokens import TokenCounter

__all__ = ["Originals", "Refs", "node_id"]


def node_id(depth: int, children: Sequence[tuple[str, str]]) -> str:
    """Content address of a node: what it covers defines it (message ids are chained content
    addresses), so the same span gives the same node in every run (deterministic output)."""
    key = json.dumps([depth, [list(c) for c in children]], separators=(",", ":"))
    return hashlib.sha256(key.encode()).hexdigest()[:16]


class Originals:
    """The originals of one session in the store (see the module docstring)."""

    def __init__(
        self, store: Any, session_id: str, *, counter: TokenCounter | None = None, reach: RecallReach | None = None, stage: NodeStage | None = None
    ) -> None:
        self.store = store
        self.session_id = str(session_id)
        self.counter = counter
        # where a compaction's nodes wait for the host to store them with its record (Services.nodes)
        self.stage = stage if isinstance(store, NodeBatchStore) else None
        # whether the recall tools reach the model (the host's, shared: Services.reach)
        self.reach = reach if reach is not None else RecallReach()
        self._recall: Recall | None = None

    @classmethod
    def from_services(cls, services: Services) -> Originals | None:
        """The session's originals, or ``None`` when no store is configured."""
        if services.store is None:
            return None
        return cls(services.store, services.session_id, counter=services.counter, reach=services.reach, stage=services.nodes)

    def pointer(self, ref: str | None = None) -> str:
        """Where a record says its removed text is
        (:func:`~ctxengine.engines.kit.records.recall_pointer`: no tool named when the recall
        tools do not reach the model)."""
        return recall_pointer(self.reach, ref)

    def use_session(self, session_id: str) -> None:
        """Records and recall go to ``session_id`` from now on."""
        if session_id and str(session_id) != self.session_id:
            self.session_id = str(session_id)
            self._recall = None

    @property
    def recall(self) -> Recall:
        if self._recall is None:
            self._recall = Recall(self.store, self.session_id, counter=self.counter)
        return self._recall

    def record(self, messages: Sequence[Message]) -> list[str]:
        """Record ``messages`` (content-addressed: what is stored already is not written again)
        and return their ids."""
        return list(self.store.record_messages(self.session_id, messages))

    def ids(self, messages: Sequence[Message]) -> tuple[list[str], bool]:
        """The store ids of ``messages`` (a history from the root) and whether they are still to
        be written with the nodes (:meth:`add_nodes`): computed without a write when the store
        batches nodes (:class:`~ctxengine.storage.NodeBatchStore`), else recorded now."""
        if isinstance(self.store, NodeBatchStore):
            return list(self.store.message_ids(messages)), True
        return self.record(messages), False

    def add_nodes(self, nodes: Sequence[NodeSpec], *, messages: Sequence[Message] = ()) -> None:
        """Store ``nodes`` (each left unchanged when it exists) after ``messages``: staged for
        the host to store with the compaction's record when it gave a stage, else in one
        transaction when the store batches them (else ``messages`` were recorded by :meth:`ids`)."""
        if self.stage is not None:
            self.stage.stage(nodes, messages)
            return
        if isinstance(self.store, NodeBatchStore):
            self.store.add_nodes(self.session_id, nodes, messages=messages)
            return
        for n in nodes:  # a store with add_node alone (storage.NodeStore)
            self.store.add_node(self.session_id, n.id, depth=n.depth, text=n.text, children=n.children, meta=dict(n.meta))

    def existing(self, nid: str) -> str | None:
        """The stored text of node ``nid``, or None."""
        try:
            return str(self.store.get_node(nid).text)
        except NotFoundError:
            return None

    def add_node(
        self,
        nid: str,
        *,
        depth: int,
        text: str,
        children: Sequence[tuple[str, str]],
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        """Store node ``nid`` (left unchanged when it exists): :meth:`add_nodes` with one node."""
        self.add_nodes([NodeSpec(nid, depth, text, list(children), dict(meta or {}))])

    def node_for(self, message_ids: Sequence[str]) -> str:
        """The id of the depth-0 node over these message ids."""
        return node_id(0, [("message", i) for i in message_ids])

    def retrievable(self, text: str) -> bool:
        """True when recall returns ``text`` verbatim."""
        return self.recall.retrievable(text)


class Refs:
    """Node ids for the records one compaction writes (the ``ref=`` of their markers): the
    compacted context's ids are taken on first use, and :meth:`commit` stores it with the
    nodes of the records the compaction kept (:meth:`Originals.add_nodes`)."""

    def __init__(self, originals: Originals | None, messages: Sequence[Message]) -> None:
        self.originals = originals
        self.messages = messages
        self._ids: list[str] | None = None
        self._unwritten = False  # the compacted context is written with the nodes
        self._nodes: dict[str, tuple[list[int], str, str | None]] = {}

    def node(self, indices: list[int], *, kind: str, text: str | None) -> str | None:
        if self.originals is None:
            return None
        if self._ids is None:
            self._ids, self._unwritten = self.originals.ids(self.messages)
        nid = self.originals.node_for([self._ids[k] for k in indices])
        self._nodes[nid] = (indices, kind, text)
        return nid

    def text(self, nid: str | None, text: str) -> None:
        if nid is not None and nid in self._nodes:
            indices, kind, _ = self._nodes[nid]
            self._nodes[nid] = (indices, kind, text)

    def commit(self, kept: set[str]) -> None:
        """Store the nodes whose record text is in ``kept``."""
        if self.originals is None or self._ids is None:
            return
        ids = self._ids
        nodes = [
            NodeSpec(nid, 0, text, [("message", ids[k]) for k in indices], {"messages": len(indices), "summarizer": kind})
            for nid, (indices, kind, text) in self._nodes.items()
            if text is not None and text in kept
        ]
        if nodes:
            self.originals.add_nodes(nodes, messages=self.messages if self._unwritten else ())
