"""The dashboard's prices: genai-prices where it knows the model, the model table where only it
does, no money for a model neither knows; each figure names its source."""

from __future__ import annotations

import pytest

from ctxengine.store import UsageRow
from ctxengine.ui import data
from ctxengine.ui.prices import OWN_TABLE, pricing


def test_a_model_genai_prices_knows_is_priced_from_it_cache_reads_as_billed() -> None:
    p = pricing("gpt-4o")
    assert p is not None and p.source.startswith("genai-prices ")
    assert p.cost(1, 1_000_000, 0, 0, 0) == pytest.approx(2.5)  # $2.50 per million input tokens
    assert p.cost(1, 1_000_000, 1_000_000, 0, 0) == pytest.approx(1.25)  # all of it read from the cache
    assert p.read * 1_000_000 == pytest.approx(1.25)
    claude = pricing("anthropic/claude-sonnet-4-5")
    assert claude is not None and claude.cost(1, 100_000, 0, 100_000, 0) == pytest.approx(0.375)  # a 5-minute cache write: 1.25 x $3


def test_a_group_is_priced_as_that_many_average_requests() -> None:
    p = pricing("claude-sonnet-4-5")
    assert p is not None
    # ten requests of 100K tokens are not one 1M-token request (the long-context price)
    assert p.cost(10, 1_000_000, 0, 0, 0) == pytest.approx(3.0)
    assert p.cost(1, 1_000_000, 0, 0, 0) > 3.0


def test_the_model_table_prices_what_genai_prices_lacks_and_unknown_models_get_no_money() -> None:
    own = pricing("qwen3-coder")
    assert own is not None and own.source == OWN_TABLE and own.cost(1, 1_000_000, 0, 0, 0) == pytest.approx(0.4)
    assert pricing("my-local-model") is None and pricing("") is None
    row = UsageRow({"model": "my-local-model"}, requests=3, tokens_in=900, tokens_out=600, prompt_tokens=600)
    assert data.price("my-local-model", row) == {"cost": None, "saved": None, "source": None}
    priced = data.price("gpt-4o", UsageRow({}, requests=1, tokens_in=2_000_000, tokens_out=1_000_000, prompt_tokens=1_000_000))
    assert priced["saved"] == pytest.approx(1.25) and str(priced["source"]).startswith("genai-prices")


def test_a_model_the_table_lacks_takes_its_window_and_prices_from_genai_prices() -> None:
    import warnings

    from ctxengine.models import UnknownModelWarning, resolve_model

    with warnings.catch_warnings():
        warnings.simplefilter("error", UnknownModelWarning)  # known now: no warning
        p = resolve_model("xai/grok-4")
    assert (p.known, p.window_source, p.provider) == (True, "genai-prices", "x-ai")
    assert p.context_length == 256_000 and p.input == pytest.approx(3.0) and p.output == pytest.approx(15.0)
    assert resolve_model("gpt-4o").window_source == "table"  # the table keeps what it has
    assert resolve_model("my-local-model", context_length=1000).window_source == "argument"


def test_the_proxy_window_of_such_a_model_names_its_source() -> None:
    from ctxengine.config import Config
    from ctxengine.proxy.limits import Window, Windows

    assert Windows(Config()).window_for("openai", "grok-4") == Window(256_000, "genai-prices")
