"""Model profiles: context length, provider, caching rules and prices.

The table lives in ``data/models.json`` (data, not code). A model name is looked up without its
``provider/`` prefix (``anthropic/claude-sonnet-4.5`` → ``claude-sonnet-4.5``) by longest
matching prefix, so dated ids (``claude-sonnet-4-5-20250929``) resolve too. Config overrides
(``models:`` in config.yaml, or ``overrides=`` here) win over the table; a key may be a glob
(``qwen*``, ``*``), applied before the keys naming the model exactly. An unknown model gets
``default_context_length`` and a warning, never an exception; a model the table lacks that
``genai-prices`` (installed with the proxy extra) knows takes its window and prices from there.
:attr:`ModelProfile.window_source` says where the window came from.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import logging
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from importlib import resources
from typing import Any

from ctxengine.errors import ConfigError

__all__ = ["DEFAULT_CONTEXT_LENGTH", "ModelProfile", "UnknownModelWarning", "known_models", "model_overrides", "resolve_model"]

log = logging.getLogger("ctxengine.models")

DEFAULT_CONTEXT_LENGTH = 128_000
"""Context length assumed for a model missing from the table: the common window of current
mid-size models, small enough that compaction fires before most providers would reject."""


class UnknownModelWarning(UserWarning):
    """A model is not in the profile table; defaults were used."""


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """What ctxengine needs to know about a model.

    Prices are USD per million input/output tokens. ``anthropic_cache`` says whether
    Anthropic ``cache_control`` breakpoints apply; ``min_cache_tokens`` is the shortest
    prefix the provider caches; ``openai_cached_discount`` is the fraction of the input price
    billed for cached tokens under OpenAI's automatic prefix caching.
    """

    name: str
    provider: str = "unknown"
    context_length: int = DEFAULT_CONTEXT_LENGTH
    anthropic_cache: bool = False
    min_cache_tokens: int = 1024
    input: float = 0.0
    output: float = 0.0
    openai_cached_discount: float = 0.5
    known: bool = True
    window_source: str = "table"
    """Where ``context_length`` comes from: ``table``, ``genai-prices`` (a model the table
    lacks, known to that maintained table), ``default`` (an unknown model),
    ``config`` (``models.<name>.context_length``), ``argument`` (``context_length=``), or what
    :meth:`ctxengine.ContextManager.set_context_length` was told (``learnt`` …)."""

    @property
    def is_claude(self) -> bool:
        return self.anthropic_cache or "claude" in self.name.lower()


@functools.cache
def _table() -> dict[str, dict[str, Any]]:
    raw = resources.files("ctxengine").joinpath("data/models.json").read_text(encoding="utf-8")
    data = json.loads(raw)
    models: dict[str, dict[str, Any]] = data["models"]
    return models


def known_models() -> list[str]:
    """Names in the built-in profile table."""
    return sorted(_table())


_FIELDS = {f.name for f in fields(ModelProfile)} - {"name", "known", "window_source"}


def _apply(profile: ModelProfile, values: Mapping[str, Any], where: str) -> ModelProfile:
    unknown = set(values) - _FIELDS
    if unknown:
        raise ConfigError(f"{where}: unknown model profile key(s) {sorted(unknown)}; allowed: {sorted(_FIELDS)}")
    checked: dict[str, Any] = {}
    for key, value in values.items():
        # dataclasses.replace does not check types: a string context length would only fail
        # later, deep inside an engine, so check against the field's current type here.
        expected = type(getattr(profile, key))
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, expected) or (expected is not bool and isinstance(value, bool)):
            raise ConfigError(f"{where}.{key}: expected {expected.__name__}, got {value!r}")
        checked[key] = value
    return replace(profile, **checked)


def _bare(model: str) -> str:
    return model.rsplit("/", 1)[-1].strip().lower()


def _is_glob(key: str) -> bool:
    return any(c in key for c in "*?[")


_PROBE = 10_000  # tokens of the request that measures a maintained table's prices per token


@functools.lru_cache(maxsize=256)
def _maintained(bare: str) -> dict[str, Any] | None:
    """The window, provider and prices of a model the table lacks, from ``genai-prices`` (a
    maintained table on PyPI, installed with the proxy extra; its bundled data, never fetched)
    when it knows the model and its window; ``None`` otherwise."""
    if not bare:
        return None
    try:
        import genai_prices
    except ImportError:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plain = genai_prices.calc_price(genai_prices.Usage(input_tokens=_PROBE, output_tokens=_PROBE), bare)
            cached = genai_prices.calc_price(genai_prices.Usage(input_tokens=_PROBE, cache_read_tokens=_PROBE), bare)
    except (LookupError, ValueError, TypeError, ArithmeticError):
        return None
    window = plain.model.context_window
    if not window:
        return None
    anthropic = plain.provider.id == "anthropic"
    per_million = 1_000_000 / _PROBE
    price_in = float(plain.input_price) * per_million
    return {
        "provider": str(plain.provider.id),
        "context_length": int(window),
        "anthropic_cache": anthropic,
        "input": price_in,
        "output": float(plain.output_price) * per_million,
        "openai_cached_discount": min(1.0, float(cached.input_price) * per_million / price_in) if price_in > 0 else 0.5,
    }


def model_overrides(model: str | None, overrides: Mapping[str, Mapping[str, Any]] | None) -> list[tuple[str, Mapping[str, Any]]]:
    """The ``models:`` entries that apply to ``model``, in the order they apply: globs
    (matched against the name with and without its ``provider/`` prefix, case-insensitively)
    in config order, then the keys naming the model exactly (bare or with prefix)."""
    name = (model or "").strip()
    bare = _bare(name)
    globs: list[tuple[str, Mapping[str, Any]]] = []
    exact: list[tuple[str, Mapping[str, Any]]] = []
    for key, values in (overrides or {}).items():
        if _is_glob(key):
            pattern = key.strip().lower()
            if fnmatch.fnmatchcase(bare, pattern) or fnmatch.fnmatchcase(name.lower(), pattern):
                globs.append((key, values))
        elif _bare(key) == bare or key == name:
            exact.append((key, values))
    return globs + exact


def resolve_model(
    model: str | None,
    *,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    default_context_length: int = DEFAULT_CONTEXT_LENGTH,
    context_length: int | None = None,
    configured_context_length: int | None = None,
) -> ModelProfile:
    """The profile of ``model``.

    ``overrides`` maps model names (bare or with prefix) or globs over them (``qwen*``) to
    profile fields, the globs applied first; ``context_length`` overrides the window outright
    (CLI ``--context-length``); ``configured_context_length`` (config ``model.context_length``)
    is the window of a model no ``overrides`` entry gives one. Unknown models get
    ``default_context_length`` and an
    :class:`UnknownModelWarning`, unless an override or ``context_length`` gives their window.
    Override values are type-checked (``ConfigError``).
    """
    name = (model or "").strip()
    bare = _bare(name)
    table = _table()
    best = ""
    for key in table:
        if bare.startswith(key) and len(key) > len(best):
            best = key
    maintained = None if best else _maintained(bare)
    if best:
        profile = ModelProfile(name=name, **table[best])
    elif maintained is not None:
        profile = ModelProfile(name=name, window_source="genai-prices", **maintained)
    else:
        profile = ModelProfile(name=name or "unknown", context_length=default_context_length, known=False, window_source="default")
        if "claude" in bare:
            profile = replace(profile, provider="anthropic", anthropic_cache=True)
    configured = False
    for key, values in model_overrides(name, overrides):
        profile = _apply(profile, values, f"models.{key}")
        if "context_length" in values:
            configured = True
            profile = replace(profile, window_source="config")
    if configured_context_length is not None and not configured:
        if configured_context_length <= 0:
            raise ConfigError(f"model.context_length must be positive, got {configured_context_length}")
        profile = replace(profile, context_length=int(configured_context_length), window_source="config")
        configured = True
    if context_length is not None:
        if context_length <= 0:
            raise ConfigError(f"context length must be positive, got {context_length}")
        profile = replace(profile, context_length=int(context_length), window_source="argument")
        configured = True
    if not profile.known and name and not configured:
        # only when nothing told us the window: following the advice below silences it
        warnings.warn(
            f"model {name!r} is not in the profile table; assuming a {default_context_length:,}-token "
            f"context window (set models.{name}.context_length in config to override)",
            UnknownModelWarning,
            stacklevel=2,
        )
    return profile
