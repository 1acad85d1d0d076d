"""Prices for the dashboard's money figures: ``genai-prices`` (a maintained price table on PyPI,
its bundled data, never fetched at run time) where it knows the model, else ctxengine's own model
table (``data/models.json``, through :func:`ctxengine.cost.billed_cost`); a model neither knows
has no price (the pages show its tokens, not invented money). Each figure names its source.

Figures are sums over many requests, so a group of requests is priced as that many average
requests: a price that depends on a request's size (long-context tiers) is taken at the
group's average request size."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ctxengine.cost import billed_cost, read_price
from ctxengine.models import UnknownModelWarning, resolve_model

__all__ = ["OWN_TABLE", "Pricing", "pricing"]

OWN_TABLE = "ctxengine model table (data/models.json, prices of 2025-11)"
_PROBE = 10_000  # tokens of the request that measures a model's cache-read price per token


@dataclass(frozen=True, slots=True)
class Pricing:
    """How one model is priced: ``bill`` (USD of a request's usage: prompt tokens with the cached
    parts, cache reads, cache writes, completion), ``read`` (USD per cache-read token) and
    ``source`` (named on the page)."""

    source: str
    bill: Callable[[int, int, int, int], float]
    read: float

    def cost(self, requests: int, prompt: int, read: int, write: int, completion: int) -> float:
        """USD of ``requests`` requests that together used these tokens (priced as that many
        average requests)."""
        if requests <= 0:
            return 0.0
        return requests * self.bill(prompt // requests, read // requests, write // requests, completion // requests)


@functools.cache
def _genai() -> tuple[Any, Any, str] | None:
    try:
        import genai_prices
    except ImportError:
        return None
    return genai_prices.calc_price, genai_prices.Usage, f"genai-prices {genai_prices.__version__} (its bundled price data)"


@functools.lru_cache(maxsize=512)
def pricing(model: str) -> Pricing | None:
    """The pricing of ``model`` (``None``: neither source knows it)."""
    if not model:
        return None
    found = _from_genai(model)
    if found is not None:
        return found
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnknownModelWarning)
        profile = resolve_model(model)
    if not profile.known or profile.input <= 0:
        return None

    def bill(prompt: int, read: int, write: int, completion: int) -> float:
        return billed_cost(profile, prompt_tokens=prompt, cache_read_tokens=read, cache_write_tokens=write, completion_tokens=completion)

    return Pricing(OWN_TABLE, bill, read_price(profile) / 1_000_000)


def _from_genai(model: str) -> Pricing | None:
    lib = _genai()
    if lib is None:
        return None
    calc, usage, source = lib
    bare = model.rsplit("/", 1)[-1]

    def bill(prompt: int, read: int, write: int, completion: int) -> float:
        u = usage(input_tokens=prompt, cache_read_tokens=read, cache_write_tokens=write, output_tokens=completion)
        return float(calc(u, bare).total_price)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            per_read = bill(_PROBE, _PROBE, 0, 0) / _PROBE
            bill(_PROBE, 0, _PROBE, 1)
    except (LookupError, ValueError, TypeError, ArithmeticError):
        return None
    return Pricing(source, bill, per_read)
