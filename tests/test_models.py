"""ctxengine.models: profile lookup, prefixes, dated ids, overrides, unknown models."""

from __future__ import annotations

import json
import warnings
from importlib import resources

import pytest

from ctxengine.errors import ConfigError
from ctxengine.models import (
    DEFAULT_CONTEXT_LENGTH,
    ModelProfile,
    UnknownModelWarning,
    known_models,
    resolve_model,
)

# A lookup that should be known must not warn: any stray UnknownModelWarning fails the test.
pytestmark = pytest.mark.filterwarnings("error::ctxengine.models.UnknownModelWarning")


@pytest.mark.parametrize(
    ("model", "provider", "context_length"),
    [
        ("claude-sonnet-4.5", "anthropic", 200_000),
        ("anthropic/claude-sonnet-4.5", "anthropic", 200_000),
        ("openrouter/anthropic/claude-sonnet-4.5", "anthropic", 200_000),
        ("claude-sonnet-4-5-20250929", "anthropic", 200_000),
        ("gpt-4o", "openai", 128_000),
        ("openai/gpt-4o-2024-08-06", "openai", 128_000),
        ("  OpenAI/GPT-4o  ", "openai", 128_000),
        ("gpt-4.1-mini-2025-04-14", "openai", 1_047_576),
        ("gemini-2.5-pro", "google", 1_048_576),
        ("gemini-3-pro-preview", "google", 1_048_576),
        ("models/gemini-2.5-flash-lite", "google", 1_048_576),
        ("gemini-flash-latest", "google", 1_048_576),
        ("deepseek/deepseek-chat", "deepseek", 128_000),
    ],
)
def test_lookup(model: str, provider: str, context_length: int) -> None:
    p = resolve_model(model)
    assert p.known
    assert p.provider == provider
    assert p.context_length == context_length
    assert p.name == model.strip()


def test_longest_prefix_wins() -> None:
    # "gpt-4o-mini" also starts with "gpt-4o"; the longer key must win
    assert resolve_model("gpt-4o-mini").input == 0.15
    assert resolve_model("gpt-4o").input == 2.5
    # claude-opus-4-5 is a different price tier from claude-opus-4
    assert resolve_model("claude-opus-4-5-20251101").input == 5.0
    assert resolve_model("claude-opus-4-1-20250805").input == 15.0
    assert resolve_model("claude-opus-4-5-20251101").min_cache_tokens == 4096


def test_claude_profiles_use_anthropic_caching() -> None:
    p = resolve_model("anthropic/claude-3-5-haiku-20241022")
    assert p.anthropic_cache and p.is_claude
    assert p.min_cache_tokens == 2048
    assert not resolve_model("gpt-4o").anthropic_cache
    assert not resolve_model("gpt-4o").is_claude


def test_unknown_model_warns_and_gets_the_default() -> None:
    with pytest.warns(UnknownModelWarning, match="my-local-model") as rec:
        p = resolve_model("vendor/my-local-model")
    assert len(rec) == 1
    assert "128,000" in str(rec[0].message)
    assert not p.known
    assert p.context_length == DEFAULT_CONTEXT_LENGTH
    assert p.provider == "unknown"
    assert p.input == 0.0


def test_unknown_model_configurable_default() -> None:
    with pytest.warns(UnknownModelWarning, match="32,000"):
        p = resolve_model("mystery-1", default_context_length=32_000)
    assert p.context_length == 32_000


def test_unknown_claude_keeps_caching_on() -> None:
    # every Claude model matches the "claude" catch-all row
    p = resolve_model("claude-future-9")
    assert p.known and p.anthropic_cache


def test_unknown_model_is_never_an_exception() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in ["", "   ", "/", "a/b/c/", "x" * 500, "模型", None]:
            assert isinstance(resolve_model(name), ModelProfile)


def test_empty_name_does_not_warn() -> None:
    p = resolve_model(None)
    assert p.name == "unknown" and not p.known
    assert resolve_model("").context_length == DEFAULT_CONTEXT_LENGTH


def test_overrides_win_over_the_table() -> None:
    p = resolve_model("gpt-4o", overrides={"gpt-4o": {"context_length": 64_000, "input": 2}})
    assert p.context_length == 64_000
    assert p.input == 2.0 and isinstance(p.input, float)
    assert p.output == 10.0  # untouched fields keep the table's values


def test_overrides_match_with_or_without_prefix() -> None:
    assert resolve_model("openai/gpt-4o", overrides={"gpt-4o": {"context_length": 1000}}).context_length == 1000
    assert resolve_model("gpt-4o", overrides={"openai/gpt-4o": {"context_length": 2000}}).context_length == 2000
    # an override for another model does not apply
    assert resolve_model("gpt-4o", overrides={"gpt-4o-mini": {"context_length": 5}}).context_length == 128_000


def test_override_for_unknown_model_silences_the_warning() -> None:
    p = resolve_model("acme/llm-7", overrides={"llm-7": {"context_length": 16_384, "provider": "acme"}})
    assert p.context_length == 16_384
    assert p.provider == "acme"
    assert not p.known


def test_override_without_context_length_still_warns() -> None:
    with pytest.warns(UnknownModelWarning):
        p = resolve_model("acme/llm-7", overrides={"llm-7": {"input": 1.0}})
    assert p.input == 1.0


def test_explicit_context_length_wins_and_silences_the_warning() -> None:
    assert resolve_model("gpt-4o", context_length=32_000).context_length == 32_000
    assert resolve_model("unknown-thing", context_length=8_000).context_length == 8_000
    p = resolve_model("gpt-4o", overrides={"gpt-4o": {"context_length": 1}}, context_length=9)
    assert p.context_length == 9


@pytest.mark.parametrize("bad", [0, -1])
def test_non_positive_context_length(bad: int) -> None:
    with pytest.raises(ConfigError, match="positive"):
        resolve_model("gpt-4o", context_length=bad)


def test_unknown_override_key_names_the_model_and_key() -> None:
    with pytest.raises(ConfigError) as info:
        resolve_model("gpt-4o", overrides={"gpt-4o": {"context_len": 5}})
    assert "models.gpt-4o" in str(info.value) and "context_len" in str(info.value)


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"context_length": "big"}, "context_length"),
        ({"context_length": 1.5}, "context_length"),
        ({"anthropic_cache": "yes"}, "anthropic_cache"),
        ({"input": "cheap"}, "input"),
        ({"min_cache_tokens": True}, "min_cache_tokens"),
        ({"provider": 3}, "provider"),
    ],
)
def test_override_values_are_type_checked(values: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        resolve_model("gpt-4o", overrides={"gpt-4o": values})


def test_known_models_matches_the_data_file() -> None:
    raw = json.loads(resources.files("ctxengine").joinpath("data/models.json").read_text(encoding="utf-8"))
    assert known_models() == sorted(raw["models"])
    for name in known_models():
        p = resolve_model(name)
        assert p.known
        assert p.context_length > 0
        assert p.input >= 0 and p.output >= 0
        assert 0 < p.openai_cached_discount <= 1
        assert p.provider != "unknown"


def test_profile_is_frozen() -> None:
    p = resolve_model("gpt-4o")
    with pytest.raises(AttributeError):
        p.context_length = 5  # type: ignore[misc]


def test_globs_and_the_window_source() -> None:
    from ctxengine.models import resolve_model

    overrides = {"qwen*": {"context_length": 32768}, "qwen2.5-coder-7b": {"context_length": 16384}, "*/local-*": {"context_length": 8192}}
    assert resolve_model("qwen2.5-coder-7b", overrides=overrides).context_length == 16384  # the exact name after the glob
    assert resolve_model("ollama/qwen3:8b", overrides=overrides).window_source == "config"
    assert resolve_model("vllm/local-llama", overrides=overrides).context_length == 8192
    assert resolve_model("gpt-4o").window_source == "table"
    assert resolve_model("gpt-4o", context_length=1000).window_source == "argument"
    # model.context_length: every model without a models: entry of its own
    assert resolve_model("gpt-4o", configured_context_length=50000).context_length == 50000
    assert resolve_model("qwen3", overrides=overrides, configured_context_length=50000).context_length == 32768
    with pytest.warns(UserWarning, match="models.my-model.context_length"):
        assert resolve_model("my-model").window_source == "default"
