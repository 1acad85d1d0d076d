"""Model windows for the proxy: what each model's window is, and what a provider's rejection says it is.

Two parts:

* :func:`context_limit_from_error` reads a provider's context-length rejection and returns the
  window it names (``None`` for any other response); :func:`is_context_length_error` says
  whether a rejection is one at all (some name no number: OpenAI's Responses API, Ollama);
* :class:`Windows` answers "what is the window of this model on this API" with one rule,
  **config > learnt > table > default**: a window configured for the model
  (``models.<name or glob>.context_length``, ``--model-window``, or ``model.context_length``
  for every model), else one learnt from a provider's rejection (:meth:`Windows.learn`; kept in
  memory for the life of the process), else the model table's, else
  ``model.default_context_length`` (``--context-length``), with a warning once per model saying
  the window assumed and how to set it.

The learnt windows live in memory only: the session store has no table for per-model facts,
and a window learnt again costs one rejected request per model and process.

Messages parsed (each tested on its real text in ``tests/test_proxy_limits.py``):

* OpenAI: ``code: context_length_exceeded``, "This model's maximum context length is 16385
  tokens. However, your messages resulted in 17000 tokens …";
* vLLM: "This model's maximum context length is 16384 tokens. However, you requested 122946
  tokens …", "'max_tokens' … is too large: 8000. This model's maximum context length is 4096
  tokens and your request has 2778 input tokens …", "The decoder prompt (length 40000) is
  longer than the maximum model length of 32768";
* Anthropic: "prompt is too long: 210000 tokens > 200000 maximum";
* Gemini: "The input token count (1200293) exceeds the maximum number of tokens allowed
  (1048576)." (``status: INVALID_ARGUMENT``);
* llama.cpp server: "request (4476 tokens) exceeds the available context size (4096 tokens)"
  (``type: exceed_context_size_error``, ``n_ctx``);
* other OpenAI-compatible servers: "Requested token count exceeds the model's maximum context
  length of 131072 tokens", "Prompt too long: 51587 tokens exceeds max context window of 32768
  tokens"; Ollama's "input length exceeds maximum context length" names no number.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import warnings
from collections.abc import Mapping
from typing import Any, NamedTuple

from ctxengine.config import Config
from ctxengine.models import UnknownModelWarning, model_overrides, resolve_model

__all__ = ["Window", "Windows", "context_limit_from_error", "is_context_length_error"]

log = logging.getLogger("ctxengine.proxy")

_MIN_WINDOW = 256
"""A number smaller than this in an error is not a window (a misread, or a max_tokens)."""

_NUM = r"(\d[\d,_]*)"

_LIMIT_PATTERNS = [
    # OpenAI, vLLM: "This model's maximum context length is 16385 tokens."
    re.compile(r"maximum context length is " + _NUM, re.I),
    # Anthropic: "prompt is too long: 210000 tokens > 200000 maximum"
    re.compile(r"too long:?\s*" + _NUM + r"\s*tokens?\s*>\s*" + _NUM + r"\s*maximum", re.I),
    # llama.cpp: "exceeds the available context size (4096 tokens)"
    re.compile(r"available context size \(?\s*" + _NUM, re.I),
    # "… exceeds the model's maximum context length of 131072 tokens"
    re.compile(r"maximum context (?:length|window|size) of " + _NUM, re.I),
    # "… exceeds max context window of 32768 tokens"
    re.compile(r"max(?:imum)? context (?:length|window|size) (?:of|is) " + _NUM, re.I),
    # Gemini: "The input token count (1200293) exceeds the maximum number of tokens allowed (1048576)."
    re.compile(r"maximum number of tokens allowed \(?\s*" + _NUM, re.I),
    # vLLM: "is longer than the maximum model length of 32768"
    re.compile(r"maximum model length (?:of|is) " + _NUM, re.I),
]

_CONTEXT_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error", "context_window_exceeded"})

_CONTEXT_PHRASES = re.compile(
    r"maximum context length|context length exceeded|context_length_exceeded|prompt is too long|"
    r"exceeds? the (?:available )?context (?:size|window)|exceeds? (?:the )?(?:model's )?max(?:imum)? context|"
    r"input length exceeds|context window of this model|maximum model length|too many tokens|"
    r"input token count .{0,40}exceeds the maximum number of tokens",
    re.I,
)


def _number(text: str) -> int:
    return int(text.replace(",", "").replace("_", ""))


def _texts(body: bytes) -> tuple[list[str], set[str], list[int]]:
    """The error's message texts, its codes/types, and any ``n_ctx`` it carries."""
    try:
        data: Any = json.loads(body.decode("utf-8", "replace")) if body else None
    except ValueError:
        data = None
    if data is None:
        return [body.decode("utf-8", "replace")[:4000]], set(), []
    texts: list[str] = []
    codes: set[str] = set()
    ctx: list[int] = []

    def walk(node: Any, depth: int) -> None:
        if depth > 4:
            return
        if isinstance(node, str):
            texts.append(node[:4000])
        elif isinstance(node, list):
            for item in node[:8]:
                walk(item, depth + 1)
        elif isinstance(node, Mapping):
            for key in ("message", "error", "detail", "msg", "errors"):
                if key in node:
                    walk(node[key], depth + 1)
            for key in ("code", "type"):
                value = node.get(key)
                if isinstance(value, str):
                    codes.add(value.lower())
            n_ctx = node.get("n_ctx")
            if isinstance(n_ctx, int) and not isinstance(n_ctx, bool):
                ctx.append(n_ctx)

    walk(data, 0)
    return texts, codes, ctx


def is_context_length_error(status: int, body: bytes) -> bool:
    """True when ``body`` (a response with HTTP ``status``) is a provider's rejection of a
    request too long for the model's window, whether or not it names the window."""
    if not 400 <= int(status) < 500:
        return False
    texts, codes, ctx = _texts(body)
    return bool(codes & _CONTEXT_CODES) or bool(ctx) or any(_CONTEXT_PHRASES.search(t) for t in texts)


def context_limit_from_error(status: int, body: bytes) -> int | None:
    """The model's window (tokens) named by a provider's context-length rejection (HTTP
    ``status``, response ``body``), or ``None`` when the response is not such a rejection or
    names no number (see the module docstring for the messages understood)."""
    if not 400 <= int(status) < 500:
        return None
    texts, codes, ctx = _texts(body)
    for text in texts:
        for pattern in _LIMIT_PATTERNS:
            match = pattern.search(text)
            if match is not None:
                n = _number(match.group(match.lastindex or 1))
                if n >= _MIN_WINDOW:
                    return n
    if ctx and (codes & _CONTEXT_CODES or any(_CONTEXT_PHRASES.search(t) for t in texts)):
        n = max(ctx)
        return n if n >= _MIN_WINDOW else None
    return None


class Window(NamedTuple):
    """A model's window and where it comes from: ``config``, ``learnt``, ``table`` or ``default``."""

    tokens: int
    source: str


class Windows:
    """The window of each model the proxy serves (see the module docstring): one rule,
    config > learnt > table > default, and the learnt windows. Thread-safe.

    The proxy asks :meth:`window_for` when it builds a model's manager and gives the answer to
    it (``ContextManager(..., context_length=w.tokens)`` then
    ``mgr.set_context_length(w.tokens, source=w.source)``); after a rejection it calls
    :meth:`learn` and gives the manager what that returns."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._learnt: dict[tuple[str, str], int] = {}
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def configured(self, model: str) -> int | None:
        """The window configured for ``model``: its ``models:`` entries (globs, then the exact
        name; the last one that sets ``context_length`` wins), else ``model.context_length``."""
        tokens: int | None = None
        for _key, values in model_overrides(model, self.config.models):
            value = values.get("context_length")
            if isinstance(value, int) and not isinstance(value, bool):
                tokens = value
        return tokens if tokens is not None else self.config.model.context_length

    def learnt(self, api: str, model: str) -> int | None:
        """The window learnt for ``model`` on ``api`` (in memory), if any."""
        with self._lock:
            return self._learnt.get((api, model))

    def window_for(self, api: str, model: str) -> Window:
        """The window of ``model`` on ``api``: config > learnt > table > default (a learnt window
        smaller than the configured one wins: the provider rejected the larger). A model with
        none of the first three gets the default and a warning, once per model, saying the
        window assumed and how to set it."""
        tokens = self.configured(model)
        learnt = self.learnt(api, model)
        if tokens is not None and (learnt is None or learnt >= tokens):
            return Window(tokens, "config")
        if learnt is not None:  # the provider's own word, below any configured window
            return Window(learnt, "learnt")
        known = _table_window(model)
        if known is not None:
            return Window(*known)
        default = self.config.model.default_context_length
        with self._lock:
            first = model not in self._warned
            self._warned.add(model)
        if first:
            log.warning(
                f"model {model!r} is not in the model table and has no configured window: assuming {default:,} tokens. "
                f"Set it with `ctxengine proxy --model-window {model}=TOKENS` (config: models: {{{model!r}: {{context_length: TOKENS}}}}), "
                "or the window of every unknown model with `--context-length TOKENS` (config: model.default_context_length)",
                extra={"fields": {"model": model, "assumed_window": default}},
            )
        return Window(default, "default")

    def learn(self, api: str, model: str, tokens: int) -> Window:
        """Remember that the provider behind ``api`` rejected a request for ``model`` naming a
        ``tokens`` window; returns the window the model's manager should now have (a
        configured window still wins unless the provider names a smaller one: then the
        provider's, with a warning to fix the configuration)."""
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens <= 0:
            raise ValueError(f"a learnt window must be a positive number of tokens, not {tokens!r}")
        with self._lock:
            before = self._learnt.get((api, model))
            self._learnt[(api, model)] = tokens
        configured = self.configured(model)
        if configured is not None:
            if tokens >= configured:
                return Window(configured, "config")
            log.warning(
                f"model {model!r}: the provider says its window is {tokens:,} tokens, smaller than the configured {configured:,}; "
                "using the provider's (fix models.<name>.context_length / --model-window)",
                extra={"fields": {"model": model, "provider_window": tokens, "configured_window": configured}},
            )
            return Window(tokens, "learnt")
        if before != tokens:
            log.info(
                f"model {model!r}: window learnt from the provider: {tokens:,} tokens",
                extra={"fields": {"model": model, "window": tokens, "api": api}},
            )
        return Window(tokens, "learnt")


def _table_window(model: str) -> tuple[int, str] | None:
    """The window of ``model`` in the model table (or in ``genai-prices`` for a model the table
    lacks) and that source (``None`` for a model neither knows)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnknownModelWarning)
        profile = resolve_model(model)
    return (profile.context_length, profile.window_source) if profile.known else None
