"""The ContextEngine ABC, name for name with seed 002, and usage normalisation."""

from __future__ import annotations

import inspect
import json
from types import SimpleNamespace
from typing import Any

import anthropic.types
import openai.types
import openai.types.responses
import pytest

from ctxengine.engine import CompactionReport, ContextEngine, Usage, normalize_usage
from ctxengine.models import DEFAULT_CONTEXT_LENGTH

SIX_ATTRIBUTES = [
    "last_prompt_tokens",
    "last_completion_tokens",
    "last_total_tokens",
    "threshold_tokens",
    "context_length",
    "compression_count",
]


class MinimalEngine(ContextEngine):
    """Implements only the four required members, like the seed's LCMEngine sketch."""

    @property
    def name(self) -> str:
        return "minimal"

    def update_from_response(self, usage: Any) -> None:
        self._record_usage(usage)

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        tokens = self.last_prompt_tokens if prompt_tokens is None else prompt_tokens
        return tokens >= self.threshold_tokens

    def compress(self, messages: list[dict[str, Any]], current_tokens: int | None = None, focus_topic: str | None = None) -> list[dict[str, Any]]:
        self.compression_count += 1
        return list(messages)


# -- the abstract contract ------------------------------------------------------------------------------


def test_four_abstract_members() -> None:
    assert ContextEngine.__abstractmethods__ == frozenset({"name", "update_from_response", "should_compress", "compress"})
    assert isinstance(inspect.getattr_static(ContextEngine, "name"), property)


def test_abc_cannot_be_instantiated() -> None:
    with pytest.raises(TypeError, match="abstract"):
        ContextEngine()  # type: ignore[abstract]


@pytest.mark.parametrize("missing", ["name", "update_from_response", "should_compress", "compress"])
def test_a_subclass_missing_a_required_member_is_abstract(missing: str) -> None:
    members = {k: v for k, v in vars(MinimalEngine).items() if k in ContextEngine.__abstractmethods__ and k != missing}
    partial = type("Partial", (ContextEngine,), members)
    with pytest.raises(TypeError, match=missing):
        partial()


def test_required_signatures_match_the_seed() -> None:
    assert list(inspect.signature(ContextEngine.update_from_response).parameters) == ["self", "usage"]
    sc = inspect.signature(ContextEngine.should_compress).parameters
    assert list(sc) == ["self", "prompt_tokens"] and sc["prompt_tokens"].default is None
    cp = inspect.signature(ContextEngine.compress).parameters
    assert list(cp) == ["self", "messages", "current_tokens", "focus_topic"]
    assert cp["current_tokens"].default is None and cp["focus_topic"].default is None


def test_six_attributes_exist_as_ints() -> None:
    for attr in SIX_ATTRIBUTES:
        assert getattr(ContextEngine, attr) == 0  # class-level defaults, as in the seed
    e = MinimalEngine(context_length=200_000)
    for attr in SIX_ATTRIBUTES:
        assert isinstance(getattr(e, attr), int), attr
    assert e.context_length == 200_000
    assert e.threshold_tokens == 100_000  # threshold_ratio 0.5 by default
    assert (e.last_prompt_tokens, e.last_completion_tokens, e.last_total_tokens, e.compression_count) == (0, 0, 0, 0)


def test_constructor_defaults_and_threshold() -> None:
    e = MinimalEngine()
    assert e.context_length == DEFAULT_CONTEXT_LENGTH
    t = MinimalEngine(context_length=1000, threshold=0.8)
    assert t.threshold_tokens == 800
    assert t.threshold_ratio == 0.8
    assert MinimalEngine.threshold_ratio == 0.5  # the class default is untouched


def test_seed_style_usage() -> None:
    """The seed's own ABC test, verbatim in spirit."""
    engine = MinimalEngine(context_length=200000)
    assert isinstance(engine, ContextEngine)
    assert engine.name == "minimal"
    result = engine.compress([{"role": "user", "content": "hello"}])
    assert isinstance(result, list)
    assert all("role" in m for m in result)


# -- optional methods and their seed defaults ---------------------------------------------------------


def test_optional_methods_are_not_abstract() -> None:
    for name in ["on_session_start", "on_session_end", "on_session_reset", "update_model", "get_tool_schemas", "handle_tool_call", "should_compress_preflight", "get_status"]:
        assert name not in ContextEngine.__abstractmethods__
        assert callable(getattr(MinimalEngine, name))


def test_session_start_and_end_are_no_ops() -> None:
    e = MinimalEngine(context_length=1000)
    e.update_from_response({"prompt_tokens": 10, "completion_tokens": 2})
    before = dict(vars(e))
    msgs = [{"role": "user", "content": "x"}]
    assert e.on_session_start("s1", platform="cli") is None
    assert e.on_session_end("s1", msgs) is None
    assert vars(e) == before
    assert msgs == [{"role": "user", "content": "x"}]


def test_session_reset_resets_the_counters() -> None:
    e = MinimalEngine(context_length=1000)
    e.update_from_response({"prompt_tokens": 700, "completion_tokens": 30})
    e.compress([])
    e.last_report = CompactionReport("minimal", 5, 3, 700, 300)
    e.on_session_reset()
    assert (e.last_prompt_tokens, e.last_completion_tokens, e.last_total_tokens, e.compression_count) == (0, 0, 0, 0)
    assert e.last_report is None
    assert (e.context_length, e.threshold_tokens) == (1000, 500)  # the model is unchanged


def test_update_model_recomputes_threshold() -> None:
    e = MinimalEngine(context_length=200_000, threshold=0.75)
    assert e.threshold_tokens == 150_000
    e.update_model("gpt-4o", 128_000)
    assert (e.context_length, e.threshold_tokens) == (128_000, 96_000)
    e.update_model("small", 8_000, base_url="http://localhost", provider="custom")
    assert (e.context_length, e.threshold_tokens) == (8_000, 6_000)
    assert not e.should_compress(5_999) and e.should_compress(6_000)


def test_tool_defaults() -> None:
    e = MinimalEngine()
    assert e.get_tool_schemas() == []
    out = e.handle_tool_call("lcm_grep", {"query": "x"}, session_id="s")
    assert json.loads(out) == {"error": "Unknown tool: lcm_grep"}


def test_preflight_default_is_false() -> None:
    e = MinimalEngine(context_length=10)
    assert e.should_compress_preflight([{"role": "user", "content": "x" * 10_000}]) is False


def test_get_status_keys_and_values() -> None:
    e = MinimalEngine(context_length=200_000)
    e.update_from_response({"prompt_tokens": 50_000, "completion_tokens": 1_000, "total_tokens": 51_000})
    status = e.get_status()
    assert status == {
        "engine": "minimal",
        "last_prompt_tokens": 50_000,
        "last_completion_tokens": 1_000,
        "last_total_tokens": 51_000,
        "threshold_tokens": 100_000,
        "context_length": 200_000,
        "compression_count": 0,
        "usage_percent": 25.0,
    }
    e.last_report = CompactionReport("minimal", 40, 12, 50_000, 10_000, replaced=[3, 4], notes=["n"])
    status = e.get_status()
    assert status["last_compaction"]["reduction"] == 0.8
    assert status["last_compaction"]["replaced"] == [3, 4]
    json.dumps(status)  # plain data, ready for logs and the store


def test_get_status_with_zero_window() -> None:
    assert MinimalEngine(context_length=0).get_status()["usage_percent"] == 0.0


# -- CompactionReport ----------------------------------------------------------------------------------------


def test_compaction_report_reduction() -> None:
    assert CompactionReport("e", 10, 5, 1000, 400).reduction == pytest.approx(0.6)
    assert CompactionReport("e", 10, 10, 0, 0).reduction == 0.0
    assert CompactionReport("e", 10, 12, 100, 150).reduction == 0.0  # never negative
    d = CompactionReport("e", 10, 5, 1000, 333, fallback="extractive", elapsed_ms=1.5).to_dict()
    assert d["reduction"] == 0.667
    assert d["fallback"] == "extractive" and d["elapsed_ms"] == 1.5


# -- normalize_usage -----------------------------------------------------------------------------------------


def test_openai_dict() -> None:
    u = normalize_usage({"prompt_tokens": 1200, "completion_tokens": 80, "total_tokens": 1280, "prompt_tokens_details": {"cached_tokens": 1024}})
    assert u == Usage(1200, 80, 1280, 1024, 0)


def test_openai_dict_without_total_or_details() -> None:
    assert normalize_usage({"prompt_tokens": 10, "completion_tokens": 5}) == Usage(10, 5, 15, 0, 0)
    assert normalize_usage({"prompt_tokens": 10, "completion_tokens": 5, "prompt_tokens_details": None}) == Usage(10, 5, 15, 0, 0)


def test_openai_sdk_object() -> None:
    usage = openai.types.CompletionUsage(prompt_tokens=2048, completion_tokens=100, total_tokens=2148, prompt_tokens_details={"cached_tokens": 1536})
    assert normalize_usage(usage) == Usage(2048, 100, 2148, 1536, 0)


def test_openai_compatible_gateway_cache_fields() -> None:
    # OpenRouter-style: writes in the details, or Anthropic-named fields next to OpenAI ones
    assert normalize_usage({"prompt_tokens": 5000, "completion_tokens": 10, "prompt_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 4000}}) == Usage(5000, 10, 5010, 0, 4000)
    mixed = {"prompt_tokens": 5000, "completion_tokens": 10, "cache_read_input_tokens": 3000, "cache_creation_input_tokens": 1500}
    assert normalize_usage(mixed) == Usage(5000, 10, 5010, 3000, 1500)


def test_openai_responses_api_object() -> None:
    usage = openai.types.responses.ResponseUsage(
        input_tokens=3000,
        output_tokens=50,
        total_tokens=3050,
        input_tokens_details={"cached_tokens": 2048, "cache_write_tokens": 0},
        output_tokens_details={"reasoning_tokens": 0},
    )
    # input_tokens already includes the cached part: not added twice
    assert normalize_usage(usage) == Usage(3000, 50, 3050, 2048, 0)


def test_anthropic_dict_adds_cached_parts_back() -> None:
    u = normalize_usage({"input_tokens": 50, "output_tokens": 300, "cache_read_input_tokens": 10_000, "cache_creation_input_tokens": 2_000})
    assert u == Usage(12_050, 300, 12_350, 10_000, 2_000)


def test_anthropic_sdk_object() -> None:
    usage = anthropic.types.Usage(input_tokens=12, output_tokens=7, cache_read_input_tokens=4096, cache_creation_input_tokens=None)
    assert normalize_usage(usage) == Usage(4108, 7, 4115, 4096, 0)


def test_plain_objects_with_attributes() -> None:
    sdk_like = SimpleNamespace(prompt_tokens=300, completion_tokens=20, total_tokens=320, prompt_tokens_details=SimpleNamespace(cached_tokens=256))
    assert normalize_usage(sdk_like) == Usage(300, 20, 320, 256, 0)
    anthropic_like = SimpleNamespace(input_tokens=5, output_tokens=1, cache_read_input_tokens=None, cache_creation_input_tokens=100)
    assert normalize_usage(anthropic_like) == Usage(105, 1, 106, 0, 100)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, Usage()),
        ({}, Usage()),
        ({"prompt_tokens": "123", "completion_tokens": " 7 "}, Usage(123, 7, 130, 0, 0)),
        ({"prompt_tokens": 0, "completion_tokens": 2.9}, Usage(0, 2, 2, 0, 0)),
        ({"prompt_tokens": True, "completion_tokens": "many"}, Usage()),
    ],
)
def test_odd_values_never_crash(raw: Any, expected: Usage) -> None:
    assert normalize_usage(raw) == expected


def test_unsupported_usage_type() -> None:
    with pytest.raises(TypeError, match="usage must be a mapping"):
        normalize_usage(42)


def test_update_from_response_sets_the_counters_from_any_shape() -> None:
    e = MinimalEngine(context_length=20_000)
    e.update_from_response(anthropic.types.Usage(input_tokens=100, output_tokens=10, cache_read_input_tokens=9_900))
    assert (e.last_prompt_tokens, e.last_completion_tokens, e.last_total_tokens) == (10_000, 10, 10_010)
    assert e.should_compress()
    e.update_from_response(openai.types.CompletionUsage(prompt_tokens=500, completion_tokens=5, total_tokens=505))
    assert (e.last_prompt_tokens, e.last_total_tokens) == (500, 505)
    assert not e.should_compress()


@pytest.mark.parametrize(
    "raw",
    [
        {"prompt_tokens": -5},
        {"prompt_tokens": float("nan")},
        {"input_tokens": float("inf"), "output_tokens": 1},
        {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": -1}},
    ],
)
def test_impossible_counts_are_rejected_naming_the_field(raw: Any) -> None:
    from ctxengine.errors import InputError

    with pytest.raises(InputError, match="tokens"):
        normalize_usage(raw)


def test_a_reports_dict_has_every_field_and_copies_its_lists() -> None:
    from dataclasses import asdict, fields

    from ctxengine.engine import CompactionReport

    report = CompactionReport("e", 5, 3, 1000, 400, replaced=[1, 2], notes=["cut"], fallback="x", elapsed_ms=2.5)
    d = report.to_dict()
    assert list(d) == [f.name for f in fields(CompactionReport)] + ["reduction"]
    assert {k: v for k, v in d.items() if k != "reduction"} == asdict(report) and d["reduction"] == 0.6
    d["replaced"].append(9)
    assert report.replaced == [1, 2]
