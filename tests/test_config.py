"""ctxengine.config: seed defaults, strict keys naming key and file, YAML errors, secrets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ctxengine.config import (
    CompactionConfig,
    CompressionConfig,
    Config,
    SummarizerConfig,
    api_key_from_env,
    load_config,
)
from ctxengine.errors import ConfigError


def write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


# -- defaults equal the seeds' -----------------------------------------------------------------


def test_compression_defaults_match_seed_003() -> None:
    c = Config().compression
    assert c.enabled is True
    assert c.threshold == 0.50
    assert c.target_ratio == 0.20
    assert c.protect_last_n == 20
    assert c.protect_first_n == 3
    assert c.summary_model is None


def test_compaction_defaults_match_seed_004() -> None:
    c = Config().compaction
    assert (
        c.trigger_threshold,
        c.protect_last_n_turns,
        c.max_tool_output_chars,
        c.keep_tool_summary,
        c.drop_system_after_turn,
        c.collapse_consecutive_assistant,
    ) == (0.60, 5, 500, True, 1, True)
    assert (c.head_lines, c.tail_lines) == (10, 5)  # "first 10 lines + last 5"


def test_summarizer_defaults_match_seed_003() -> None:
    aux = Config().auxiliary.compression
    assert aux.model is None
    assert aux.provider == "auto"
    assert aux.base_url is None


def test_context_engine_default_is_the_compressor() -> None:
    assert Config().context.engine == "compressor"


def test_cache_ttl_default_and_both_places() -> None:
    assert Config().cache_ttl == "5m"
    assert Config.from_dict({"prompt_caching": {"cache_ttl": "1h"}}).cache_ttl == "1h"
    assert Config.from_dict({"model": {"cache_ttl": "1h"}}).cache_ttl == "1h"  # the older seed's place
    # the newer key wins when both are set
    both = Config.from_dict({"prompt_caching": {"cache_ttl": "5m"}, "model": {"cache_ttl": "1h"}})
    assert both.cache_ttl == "5m"


@pytest.mark.parametrize("ttl", ["10m", "5", "", 5])
def test_cache_ttl_values_are_checked(ttl: object) -> None:
    with pytest.raises(ConfigError, match="cache_ttl"):
        Config.from_dict({"prompt_caching": {"cache_ttl": ttl}})


def test_defaults_from_an_empty_file(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "")) == Config(source=str(tmp_path / "config.yaml"))
    assert load_config(write(tmp_path, "# only a comment\n")).compression.threshold == 0.50


def test_no_path_gives_defaults_or_the_env_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_config() == Config()
    p = write(tmp_path, "context:\n  engine: rules\n")
    monkeypatch.setenv("CTXENGINE_CONFIG", str(p))
    cfg = load_config()
    assert cfg.context.engine == "rules"
    assert cfg.source == str(p)


# -- a full seed-style file ------------------------------------------------------------------------

SEED_FILE = """\
context:
  engine: "rules"
compression:
  enabled: true
  threshold: 0.65
  target_ratio: 0.30
  protect_last_n: 12
auxiliary:
  compression:
    model: "google/gemini-2.5-flash"
    provider: "openrouter"
    base_url: "https://openrouter.ai/api/v1"
prompt_caching:
  cache_ttl: "1h"
compaction:
  trigger_threshold: 0.70
  protect_last_n_turns: 3
  max_tool_output_chars: 800
  keep_tool_summary: false
  drop_system_after_turn: 0
  collapse_consecutive_assistant: false
models:
  my-model:
    context_length: 32000
"""


def test_seed_style_file_loads(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, SEED_FILE))
    assert cfg.context.engine == "rules"
    assert (cfg.compression.threshold, cfg.compression.target_ratio, cfg.compression.protect_last_n) == (0.65, 0.30, 12)
    aux = cfg.auxiliary.compression
    assert (aux.model, aux.provider, aux.base_url) == ("google/gemini-2.5-flash", "openrouter", "https://openrouter.ai/api/v1")
    assert cfg.cache_ttl == "1h"
    assert cfg.compaction == CompactionConfig(
        trigger_threshold=0.70,
        protect_last_n_turns=3,
        max_tool_output_chars=800,
        keep_tool_summary=False,
        drop_system_after_turn=0,
        collapse_consecutive_assistant=False,
    )
    assert cfg.models == {"my-model": {"context_length": 32000}}
    assert cfg.source == str(tmp_path / "config.yaml")


def test_summary_model_is_an_alias_of_the_auxiliary_model() -> None:
    cfg = Config.from_dict({"compression": {"summary_model": "gpt-4o-mini"}})
    assert cfg.auxiliary.compression.model == "gpt-4o-mini"
    # the newer key wins when both are given
    both = Config.from_dict({"compression": {"summary_model": "a"}, "auxiliary": {"compression": {"model": "b"}}})
    assert both.auxiliary.compression.model == "b"


# -- unknown keys and bad values name the key and the file -----------------------------------------


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("compression:\n  thresold: 0.5\n", "compression.thresold"),
        ("contxt:\n  engine: rules\n", "contxt"),
        ("auxiliary:\n  compression:\n    api_base: http://x\n", "auxiliary.compression.api_base"),
        ("compaction:\n  trigger: 0.5\n", "compaction.trigger"),
    ],
)
def test_unknown_key_names_key_and_file(tmp_path: Path, text: str, key: str) -> None:
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(p)
    msg = str(info.value)
    assert f"unknown key '{key}'" in msg
    assert str(p) in msg


def test_every_unknown_key_is_listed(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "compression:\n  a: 1\n  b: 2\n"))
    assert "compression.a" in str(info.value) and "compression.b" in str(info.value)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("compression:\n  threshold: 1.5\n", "compression.threshold"),
        ("compression:\n  threshold: 0\n", "compression.threshold"),
        ("compression:\n  protect_last_n: 0\n", "compression.protect_last_n"),
        ("compression:\n  enabled: maybe\n", "compression.enabled"),
        ("compaction:\n  max_tool_output_chars: -1\n", "compaction.max_tool_output_chars"),
        ("compaction:\n  trigger_threshold: high\n", "compaction.trigger_threshold"),
        ("models:\n  gpt-4o: 5\n", "models"),
        ("compression: 3\n", "compression"),
    ],
)
def test_bad_values_name_key_and_file(tmp_path: Path, text: str, key: str) -> None:
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(p)
    assert key in str(info.value)
    assert str(p) in str(info.value)


def test_from_dict_names_its_source() -> None:
    with pytest.raises(ConfigError, match=r"^settings\.yaml: unknown key 'nope'"):
        Config.from_dict({"nope": 1}, "settings.yaml")


def test_bad_yaml_names_the_line(tmp_path: Path) -> None:
    p = write(tmp_path, "context:\n  engine: rules\ncompression:\n  threshold: [0.5\n  enabled: true\n")
    with pytest.raises(ConfigError) as info:
        load_config(p)
    msg = str(info.value)
    assert str(p) in msg and "invalid YAML" in msg
    assert "line 5" in msg


def test_bad_yaml_tab_indent(tmp_path: Path) -> None:
    p = write(tmp_path, "context:\n\tengine: rules\n")
    with pytest.raises(ConfigError, match="line 2"):
        load_config(p)


def test_duplicate_key_names_both_lines(tmp_path: Path) -> None:
    # plain YAML would keep only the second block and drop threshold silently
    p = write(tmp_path, "compression:\n  threshold: 0.4\ncontext:\n  engine: rules\ncompression:\n  enabled: false\n")
    with pytest.raises(ConfigError) as info:
        load_config(p)
    msg = str(info.value)
    assert str(p) in msg
    assert "line 5" in msg and "duplicate key 'compression' (first given on line 1)" in msg


def test_duplicate_key_in_a_nested_flow_mapping(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="duplicate key 'context_length'"):
        load_config(write(tmp_path, "models:\n  a: {context_length: 5, context_length: 6}\n"))


def test_yaml_merge_keys_may_be_overridden(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "models:\n  a: &base {context_length: 5000, input: 2.0}\n  b:\n    <<: *base\n    input: 1.0\n"))
    assert cfg.models["b"] == {"context_length": 5000, "input": 1.0}


def test_yaml_python_tags_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(write(tmp_path, "context: !!python/object/apply:os.system ['true']\n"))


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(write(tmp_path, text))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path)  # a directory
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("context:\n  engine: r\xe9gles\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1\.yaml"):
        load_config(bad)


# -- secrets never in the file ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "dotted"),
    [
        ("auxiliary:\n  compression:\n    api_key: sk-123\n", "auxiliary.compression.api_key"),
        ("api_key: sk-123\n", "api_key"),
        ("models:\n  gpt-4o:\n    api_key: sk-1\n", "models.gpt-4o.api_key"),
        ("store:\n  password: hunter2\n", "store.password"),
    ],
)
def test_api_key_in_file_is_rejected(tmp_path: Path, text: str, dotted: str) -> None:
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(p)
    msg = str(info.value)
    assert f"'{dotted}' must not hold a secret" in msg
    assert str(p) in msg
    assert "CTXENGINE_API_KEY" in msg  # the advice names where the key goes
    assert "sk-1" not in msg and "hunter2" not in msg  # the secret itself is never echoed


def test_api_key_env_names_a_variable(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "auxiliary:\n  compression:\n    provider: custom\n    api_key_env: MY_LLM_KEY\n"))
    aux = cfg.auxiliary.compression
    assert api_key_from_env(aux, {"MY_LLM_KEY": "k-mine", "CTXENGINE_API_KEY": "k-generic"}) == "k-mine"
    assert api_key_from_env(aux, {"CTXENGINE_API_KEY": "k-generic"}) is None
    assert api_key_from_env(aux, {"MY_LLM_KEY": ""}) is None


@pytest.mark.parametrize(
    ("provider", "var"),
    [
        ("openai", "OPENAI_API_KEY"),
        ("openrouter", "OPENROUTER_API_KEY"),
        ("anthropic", "ANTHROPIC_API_KEY"),
        ("OpenRouter", "OPENROUTER_API_KEY"),
    ],
)
def test_provider_variables(provider: str, var: str) -> None:
    aux = SummarizerConfig(provider=provider)
    assert api_key_from_env(aux, {var: "k-provider"}) == "k-provider"
    assert api_key_from_env(aux, {var: "k-provider", "CTXENGINE_API_KEY": "k-generic"}) == "k-generic"
    assert api_key_from_env(aux, {}) is None


def test_api_key_from_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    aux = SummarizerConfig(provider="anthropic")
    assert api_key_from_env(aux) is None
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k-env")
    assert api_key_from_env(aux) == "k-env"


def test_auto_provider_without_generic_key_has_none() -> None:
    assert api_key_from_env(SummarizerConfig(), {"OPENAI_API_KEY": "k"}) is None


# -- with_overrides -----------------------------------------------------------------------------------


def test_with_overrides_returns_a_validated_copy(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, SEED_FILE))
    out = cfg.with_overrides(context={"engine": "lcm"}, compression={"threshold": 0.4})
    assert out.context.engine == "lcm"
    assert out.compression.threshold == 0.4
    assert out.compression.protect_last_n == 12  # other keys of the section kept
    assert out.source == cfg.source
    assert cfg.context.engine == "rules" and cfg.compression.threshold == 0.65  # original untouched


def test_with_overrides_merges_nested_sections(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, SEED_FILE))
    out = cfg.with_overrides(auxiliary={"compression": {"model": "gpt-4o-mini"}})
    aux = out.auxiliary.compression
    assert aux.model == "gpt-4o-mini"
    assert (aux.provider, aux.base_url) == ("openrouter", "https://openrouter.ai/api/v1")
    more = cfg.with_overrides(models={"my-model": {"input": 1.0}, "other": {"context_length": 8}})
    assert more.models == {"my-model": {"context_length": 32000, "input": 1.0}, "other": {"context_length": 8}}


def test_with_overrides_rejects_unknown_sections_keys_values_and_secrets() -> None:
    cfg = Config()
    with pytest.raises(ConfigError, match="unknown config section 'nope'"):
        cfg.with_overrides(nope={"a": 1})
    with pytest.raises(ConfigError, match=r"unknown key 'compression\.thresold'"):
        cfg.with_overrides(compression={"thresold": 0.3})
    with pytest.raises(ConfigError, match=r"compression\.threshold"):
        cfg.with_overrides(compression={"threshold": 3})
    with pytest.raises(ConfigError, match="must not hold a secret"):
        cfg.with_overrides(auxiliary={"compression": {"api_key": "sk"}})


def test_assignment_is_validated() -> None:
    c = CompressionConfig()
    with pytest.raises(ValueError, match="threshold"):
        c.threshold = 2.0


# -- honoured or refused at load time ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"context": {"token_counter": "exakt"}}, "context.token_counter"),
        ({"context": {"token_counter": "exact:p50k_base"}}, "unknown token counter"),
        ({"models": {"m": {"context_lenght": 5}}}, "models.m.context_lenght"),
        ({"models": {"m": {"context_length": "5"}}}, "models.m.context_length"),
        ({"models": {"m": {"context_length": -1}}}, "models.m.context_length"),
        ({"models": {"m": {"anthropic_cache": "yes"}}}, "models.m.anthropic_cache"),
        ({"models": {"m": 5}}, "models.m"),
        ({"model": {"context_length": 0}}, "model.context_length"),
        ({"auxiliary": {"compression": {"deadline": 0}}}, "auxiliary.compression.deadline"),
        ({"redaction": {"contents": True}}, "redaction.contents"),
    ],
)
def test_bad_values_fail_in_load_config_naming_key_and_file(tmp_path: Path, data: dict[str, Any], expected: str) -> None:
    import yaml

    p = tmp_path / "config.yaml"
    p.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(p)
    assert expected in str(info.value) and str(p) in str(info.value)


def test_every_accepted_token_counter_is_one_the_library_builds() -> None:
    from ctxengine.config import TOKEN_COUNTERS
    from ctxengine.tokens import get_counter

    for name in TOKEN_COUNTERS:
        assert Config.from_dict({"context": {"token_counter": name}}).context.token_counter == name
        assert get_counter(name).name.startswith(name.split(":")[0])


def test_model_overrides_keep_their_values() -> None:
    cfg = Config.from_dict({"models": {"my-model": {"context_length": 32_000, "input": 1, "anthropic_cache": False}}})
    assert cfg.models == {"my-model": {"context_length": 32_000, "input": 1.0, "anthropic_cache": False}}
