"""The compressor's modes: digests by default from a config, summaries when one is asked for."""

from __future__ import annotations

import json

import pytest

from ctxengine.config import Config
from ctxengine.engines.compressor import ContextCompressor
from ctxengine.engines.compressor_modes import resolve_mode
from ctxengine.errors import ConfigError
from ctxengine.messages import Message, content_text
from ctxengine.registry import EngineRegistry
from ctxengine.store import SqliteStore
from ctxengine.summarize.extractive import ExtractiveSummarizer


def _session(groups: int, lines: int = 80) -> list[Message]:
    msgs: list[Message] = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Fix the build."}]
    for k in range(groups):
        call = {"id": f"c{k}", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": f"cat src/f{k}.txt"})}}
        msgs.append({"role": "assistant", "content": f"step {k}", "tool_calls": [call]})
        body = [f"{n}: line {n} of output {k} with some words in it" for n in range(lines)]
        body[40] = f"ERROR: build failed in src/main/java/App{k}.java"
        msgs.append({"role": "tool", "tool_call_id": f"c{k}", "content": "\n".join(body)})
    return msgs


def _create(cfg: Config, **services: object) -> ContextCompressor:
    engine = EngineRegistry(entry_points=False).create("compressor", cfg, context_length=20_000, **services)
    assert isinstance(engine, ContextCompressor)
    return engine


def test_the_default_config_compacts_with_digests() -> None:
    assert Config().context.engine == "compressor" and Config().compression.mode == "auto"
    engine = _create(Config())
    assert engine.name == "compressor" and engine.mode == "digest"
    assert engine.get_status()["mode"] == "digest"


def test_a_summarizer_or_an_explicit_setting_keeps_summaries() -> None:
    assert _create(Config(), summarizer=ExtractiveSummarizer()).mode == "summary"
    assert _create(Config.from_dict({"compression": {"mode": "summary"}})).mode == "summary"
    assert _create(Config.from_dict({"compression": {"mode": "digest"}}), summarizer=ExtractiveSummarizer()).mode == "digest"
    assert resolve_mode("auto", summarizer=object()) == "summary" and resolve_mode("auto", summarizer=None) == "digest"


def test_a_bad_mode_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="mode"):
        Config.from_dict({"compression": {"mode": "cheap"}})
    with pytest.raises(ConfigError, match=r"compression\.mode"):
        ContextCompressor(context_length=20_000, mode="cheap")


def test_hermes_constructor_still_summarizes() -> None:
    engine = ContextCompressor("some-model", 0.5, 3, 20, context_length=20_000)
    assert engine.mode == "summary" and engine.protect_last_n == 20
    assert ContextCompressor(context_length=20_000, mode="digest").mode == "digest"


def test_digest_mode_folds_older_outputs_and_keeps_recent_ones_whole() -> None:
    store = SqliteStore(":memory:")
    engine = _create(Config(), store=store)
    engine.on_session_start("s1")
    msgs = _session(14)
    tokens = sum(engine.counter.count_messages([m]) for m in msgs)
    assert engine._digests is not None and tokens >= engine._digests.threshold_tokens
    assert engine.should_compress(tokens)
    out = engine.compress(msgs, tokens)
    assert out is not msgs and len(out) < len(msgs)
    assert engine.compression_count == 1 and engine.last_report is not None
    assert any(content_text(m.get("content")).startswith("[ctxengine:digest") for m in out)
    # the last two tool outputs are still whole
    assert [m for m in out if m.get("role") == "tool"][-2:] == [m for m in msgs if m.get("role") == "tool"][-2:]
    assert not any("[CONTEXT COMPACTION]" in content_text(m.get("content")) for m in out)
    # what was folded stays retrievable verbatim
    assert engine.retrievable("ERROR: build failed in src/main/java/App0.java")


def test_disabled_digest_mode_never_triggers() -> None:
    engine = _create(Config.from_dict({"compression": {"enabled": False}}))
    msgs = _session(14)
    assert not engine.should_compress(10**6) and not engine.should_compress_preflight(msgs)


def test_an_explicit_threshold_sets_where_digests_fold() -> None:
    engine = _create(Config.from_dict({"compression": {"threshold": 0.7}}))
    assert engine._digests is not None and engine._digests.threshold_tokens == 14_000
    assert _create(Config())._digests is not None


def test_a_forced_compaction_compacts_in_digest_mode() -> None:
    """A host's forced compaction (the seed's manual /compress) is judged at the threshold."""
    engine = _create(Config())
    msgs = _session(10)
    tokens = sum(engine.counter.count_messages([m]) for m in msgs)
    assert tokens < engine.threshold_tokens and not engine.should_compress(tokens)
    out = engine.compress(msgs, engine.threshold_tokens)
    assert len(out) < len(msgs) and engine.compression_count == 1
    assert [m for m in out if m.get("role") == "tool"][-2:] == [m for m in msgs if m.get("role") == "tool"][-2:]
