"""Test helpers shipped for users and plugin authors.

* :func:`check_engine_contract` runs the invariants every engine keeps (DESIGN §3.3) on any
  :class:`ctxengine.ContextEngine` with generated conversations (needs ``hypothesis``);
* :mod:`ctxengine.testing.strategies` holds the hypothesis strategies it uses;
* :class:`StubServer` is an OpenAI- and Anthropic-compatible HTTP server on 127.0.0.1 with
  scriptable replies (text, errors, delays, empty content, 429s), to test a summarizer setup
  offline.

Names are imported on first use, so the stub server works without hypothesis installed.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "INVARIANTS",
    "ContractReport",
    "ContractViolation",
    "RecordedRequest",
    "StubReply",
    "StubServer",
    "check_engine_contract",
]

_WHERE = {
    "INVARIANTS": "ctxengine.testing.contract",
    "ContractReport": "ctxengine.testing.contract",
    "ContractViolation": "ctxengine.testing.contract",
    "check_engine_contract": "ctxengine.testing.contract",
    "RecordedRequest": "ctxengine.testing.stub_server",
    "StubReply": "ctxengine.testing.stub_server",
    "StubServer": "ctxengine.testing.stub_server",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'ctxengine.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
