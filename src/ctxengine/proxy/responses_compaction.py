"""The compaction token of the Responses adapter: the ``encrypted_content`` of a ctxengine
``compaction`` item carries the compacted messages themselves (``ctxengine:v1:`` + base64 of
compressed JSON), so :func:`~ctxengine.proxy.responses.compact_reply` needs no server state and
every later request expands the item again (:mod:`ctxengine.proxy.responses_read`).
"""

from __future__ import annotations

import base64
import binascii
import functools
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from ctxengine.errors import InputError
from ctxengine.messages import Message

__all__ = ["COMPACTION_PREFIX", "decode_compaction", "encode_compaction"]

COMPACTION_PREFIX = "ctxengine:v1:"
_PREFIX_BYTES = COMPACTION_PREFIX.encode()
"""How the ``encrypted_content`` of a ctxengine compaction item starts."""

_MAX_EXPANDED = 256 * 1024 * 1024  # bytes a compaction token may expand to


def encode_compaction(messages: Sequence[Message]) -> str:
    """The ``encrypted_content`` of a ctxengine compaction item standing for ``messages``."""
    raw = orjson.dumps(list(messages))
    return COMPACTION_PREFIX + base64.urlsafe_b64encode(zlib.compress(raw, 6)).decode("ascii")


@functools.lru_cache(maxsize=32)
def _expanded(token: str) -> bytes:
    try:
        packed = base64.urlsafe_b64decode(token[len(COMPACTION_PREFIX) :].encode("ascii"))
    except (binascii.Error, ValueError, UnicodeEncodeError) as exc:
        raise InputError(f"not base64 ({exc})") from None
    inflate = zlib.decompressobj()
    try:
        raw = inflate.decompress(packed, _MAX_EXPANDED)
    except zlib.error as exc:
        raise InputError(f"not compressed data ({exc})") from None
    if inflate.unconsumed_tail:
        raise InputError(f"expands to more than {_MAX_EXPANDED} bytes")
    if not inflate.eof:
        raise InputError("truncated")
    return raw


def decode_compaction(token: str) -> list[Message]:
    """The messages a ctxengine compaction token stands for; :class:`InputError` if it is not one
    or is damaged."""
    if not isinstance(token, str) or not token.startswith(COMPACTION_PREFIX):
        raise InputError("not a ctxengine compaction token")
    raw = _expanded(token)
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InputError(f"not JSON ({exc})") from None
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        raise InputError("not a list of messages")
    return value


def _is_ours(item: Mapping[str, Any]) -> bool:
    content = item.get("encrypted_content")
    return item.get("type") == "compaction" and isinstance(content, str) and content.startswith(COMPACTION_PREFIX)
