"""ctxengine.errors: one root, the tree drawn in the module docstring, InvalidMessages' payload."""

from __future__ import annotations

import re

import pytest

import ctxengine
from ctxengine import errors
from ctxengine.errors import (
    ConfigError,
    CtxEngineError,
    InputError,
    InvalidMessages,
    NotFoundError,
    StoreError,
    SummarizerAuthError,
    SummarizerContextError,
    SummarizerError,
)
from ctxengine.messages import Violation, check

ERROR_CLASSES = [getattr(errors, name) for name in errors.__all__]


def _docstring_tree() -> dict[str, str]:
    """child -> parent, read from the box drawing in the module docstring."""
    parents: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in (errors.__doc__ or "").splitlines():
        m = re.match(r"^(\s*)(?:[│ ]*[├└]── )?([A-Z]\w+Error|InvalidMessages|CtxEngineError)\b", line)
        if not m or ("──" not in line and m.group(2) != "CtxEngineError"):
            continue
        depth = line.index(m.group(2))
        name = m.group(2)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if stack:
            parents[name] = stack[-1][1]
        stack.append((depth, name))
    return parents


def test_every_error_derives_from_the_root() -> None:
    assert ERROR_CLASSES
    for cls in ERROR_CLASSES:
        assert issubclass(cls, CtxEngineError), cls
        assert issubclass(cls, Exception)


def test_docstring_tree_matches_the_classes() -> None:
    tree = _docstring_tree()
    documented = set(tree) | {"CtxEngineError"}
    assert documented == set(errors.__all__)
    for child, parent in tree.items():
        cls = getattr(errors, child)
        assert getattr(errors, parent) in cls.__bases__, f"{child} should derive from {parent}"


def test_specific_parents() -> None:
    assert issubclass(SummarizerAuthError, SummarizerError)
    assert issubclass(SummarizerContextError, SummarizerError)
    assert issubclass(NotFoundError, StoreError)
    # bad input is also a ValueError / a missing key also a KeyError, for callers that catch those
    for cls in (InvalidMessages, InputError, ConfigError):
        assert issubclass(cls, ValueError)
    assert issubclass(NotFoundError, KeyError)


def test_errors_are_exported_from_the_package() -> None:
    for name in errors.__all__:
        assert getattr(ctxengine, name) is getattr(errors, name)


def test_catching_the_root_catches_everything() -> None:
    for cls in ERROR_CLASSES:
        exc = cls([]) if cls is InvalidMessages else cls("boom")
        with pytest.raises(CtxEngineError):
            raise exc


def test_invalid_messages_carries_violations() -> None:
    vs = (Violation(0, "bad_role", "unknown role 'x'"), Violation(3, "result_without_call", "tool result 'c' answers nothing"))
    err = InvalidMessages(vs, context="request")
    assert err.violations == list(vs)
    assert isinstance(err.violations, list)
    assert str(err) == "invalid request: 2 violation(s): [0] bad_role: unknown role 'x'; [3] result_without_call: tool result 'c' answers nothing"


def test_invalid_messages_from_check_lists_every_violation() -> None:
    with pytest.raises(InvalidMessages) as info:
        check([{"role": "robot"}, {"role": "tool", "tool_call_id": "x", "content": ""}])
    assert [(v.index, v.code) for v in info.value.violations] == [(0, "bad_role"), (1, "result_without_call")]


def test_invalid_messages_default_context_and_truncation() -> None:
    err = InvalidMessages([Violation(i, "not_a_dict", "x") for i in range(12)])
    assert str(err).startswith("invalid messages: 12 violation(s): [0] not_a_dict: x;")
    assert str(err).endswith("… and 2 more")
    assert str(err).count("not_a_dict") == 10


def test_not_found_error_str_is_the_message() -> None:
    assert str(NotFoundError("session 'abc' does not exist")) == "session 'abc' does not exist"
    assert str(NotFoundError()) == "not found"
