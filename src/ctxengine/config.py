"""Configuration: ``config.yaml`` loaded into pydantic models, unknown keys rejected.

Keys and defaults follow the seed system so its users can bring their file::

    context:
      engine: compressor            # compressor | rules | lcm | a plugin's name
    compressor:                     # the compressor engine (seed 000/003 defaults; older name: compression)
      enabled: true
      threshold: 0.50               # fire at 50 % of the context window
      target_ratio: 0.20            # tail budget = threshold_tokens × target_ratio
      protect_last_n: 20            # never fewer recent messages kept verbatim
      summary_model: null           # older alias of auxiliary.compression.model
      mode: auto                    # auto (summary when a model is set, else digest) | digest | summary
    auxiliary:
      compression:                  # the summarizer model (seed 003)
        provider: auto              # auto | openai | openrouter | anthropic | custom …
        model: null                 # null: no LLM, the extractive summarizer
        base_url: null              # any OpenAI-compatible endpoint
    prompt_caching:
      cache_ttl: 5m                 # 5m | 1h | auto (1h once a person paces the session)
      strategy: auto                # auto (planner: measured cheapest) | planner | system_and_3
    model:
      default: null                 # the model of ContextManager.from_config
      context_length: null          # the window of every model without a models: entry of its own
      default_context_length: 128000  # the window of a model not in the table (proxy --context-length)
    models:                         # per model, or per glob (proxy --model-window MODEL=TOKENS)
      "qwen*": {context_length: 32768}
    rules:                          # the rules engine (seed 004 defaults; older name: compaction)
      trigger_threshold: 0.60
      protect_last_n_turns: 5
      max_tool_output_chars: 500
      keep_tool_summary: true
      drop_system_after_turn: 1
      collapse_consecutive_assistant: true

An engine's section is named after the engine (``compressor``, ``rules``, ``lcm``,
``cacheaware``); the seeds' names ``compression`` and ``compaction`` are accepted for the first
two (:data:`SECTION_ALIASES`), and giving both spellings with different keys is an error.

API keys are never read from the file: they come from the environment
(``CTXENGINE_API_KEY``, or the provider's own variable such as ``OPENAI_API_KEY``,
``OPENROUTER_API_KEY``, ``ANTHROPIC_API_KEY``; ``auxiliary.compression.api_key_env`` names
another). A key named ``api_key`` in the file is rejected with that advice.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ctxengine.errors import ConfigError

__all__ = [
    "SECTION_ALIASES",
    "TOKEN_COUNTERS",
    "AuxiliaryConfig",
    "CacheAwareConfig",
    "CompactionConfig",
    "CompressionConfig",
    "Config",
    "ContextConfig",
    "LcmConfig",
    "ModelConfig",
    "PromptCachingConfig",
    "ProxyConfig",
    "RedactionConfig",
    "StoreConfig",
    "SummarizerConfig",
    "api_key_from_env",
    "load_config",
    "with_section_names",
]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


TOKEN_COUNTERS = ("estimate", "exact", "exact:o200k_base", "exact:cl100k_base")
"""Every value ``context.token_counter`` accepts (the counters of :func:`ctxengine.tokens.get_counter`)."""


class ContextConfig(_Section):
    engine: str = Field("compressor", description="Active engine: compressor, rules, lcm, or a plugin name.")
    token_counter: str = Field("estimate", description="estimate | exact | exact:o200k_base | exact:cl100k_base")
    completion_reserve: int | None = Field(
        None,
        ge=0,
        description="Tokens kept free for the model's answer: no request is larger than the window minus this minus window_margin. Default: min(8192, window/16).",
    )
    window_margin: float = Field(
        0.03,
        ge=0.0,
        lt=0.5,
        description="Share of the window kept free for providers whose tokenizer counts more than o200k (requests are measured with o200k).",
    )
    engine_timeout: float | None = Field(
        300.0,
        gt=0,
        description="Seconds one compress() may take; a late result is discarded (EngineError, or the fallback engine). null: no deadline.",
    )
    fallback_engine: str | None = Field(
        None,
        description="Engine used for a session when the configured one fails to load, start or compress (the reason is logged). null: the error is raised.",
    )

    @field_validator("token_counter")
    @classmethod
    def _known_counter(cls, v: str) -> str:
        name = v.strip()
        if name not in TOKEN_COUNTERS:
            raise ValueError(f"unknown token counter {v!r}; use one of {', '.join(TOKEN_COUNTERS)}")
        return name


class CompressionConfig(_Section):
    """The compressor engine (seed defaults)."""

    enabled: bool = True
    threshold: float = Field(0.50, gt=0.0, le=1.0)
    target_ratio: float = Field(0.20, ge=0.05, le=0.95)
    protect_last_n: int = Field(20, ge=1)
    protect_first_n: int = Field(3, ge=1)
    summary_model: str | None = None
    mode: Literal["auto", "digest", "summary"] = Field(
        "auto",
        description="How the compressor compacts: digest (older tool exchanges folded in batches into digests, the cheapest under prompt caching; settings in cacheaware:), summary (the structured summary), auto (summary when a summarizer model is configured, else digest).",
    )
    user_quote_budget_tokens: int = Field(20_000, ge=0, description="Older user messages quoted in the summary, most recent first: at most this many tokens and half the summary's budget; a message over 120 tokens is quoted by its first words and the names of the files it pastes (the rest, and the messages that do not fit, stay retrievable).")
    backoff_turns: int = Field(3, ge=0, description="Turns to wait after a compression that could not get below the threshold.")


class SummarizerConfig(_Section):
    """``auxiliary.compression``: the model that writes summaries."""

    provider: str = "auto"
    model: str | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    timeout: float = Field(60.0, gt=0, description="Seconds one request may take (capped by the time left before the deadline).")
    max_retries: int = Field(2, ge=0, description="Further attempts after a failed request (429, 5xx, timeouts, bad replies), all within the deadline.")
    deadline: float = Field(90.0, gt=0, description="Seconds one compaction may spend in the summarizer, every request, retry and Retry-After wait included; then the extractive summary is used.")
    failure_threshold: int = Field(2, ge=1, description="Consecutive failed summaries that start a cooldown.")
    cooldown: float = Field(60.0, ge=0, description="Seconds the summarizer is skipped after failing (extractive meanwhile); doubles on each failed probe, up to 16x.")
    context_length: int | None = Field(None, gt=0, description="The summarizer's own window; looked up from the model table when unset.")
    max_output_tokens: int = Field(8192, ge=256, description="Ceiling of the summarizer's max_tokens: most models reject more than 8,192 output tokens.")
    redact_content: bool = Field(False, description="Remove key-shaped strings from the conversation before it is sent (set by redaction.content).")


class AuxiliaryConfig(_Section):
    compression: SummarizerConfig = Field(default_factory=SummarizerConfig)


class PromptCachingConfig(_Section):
    enabled: bool | Literal["auto"] = "auto"
    cache_ttl: Literal["5m", "1h", "auto"] | None = Field(
        None,
        description="TTL of the cache markers: 5m, 1h, or auto (1h once a person paces the session, a pause over a minute between requests; 5m while it is machine-paced). Default: model.cache_ttl, else 5m.",
    )
    strategy: Literal["auto", "system_and_3", "planner"] = Field(
        "auto",
        description="Where cache breakpoints go: auto (the placement measured cheapest for the provider: planner), planner, or the seed's system_and_3.",
    )
    pressure_warnings: bool = False


class ModelConfig(_Section):
    """``model:``; ``cache_ttl`` is the older seed's place for the TTL."""

    default: str | None = None
    context_length: int | None = Field(None, gt=0)
    default_context_length: int = Field(128_000, gt=0)
    cache_ttl: Literal["5m", "1h"] | None = None
    provider: str | None = Field(
        None,
        description="Where requests go (anthropic, openrouter, openai, …); decides cache markers. Default: inferred from the model name.",
    )


class CompactionConfig(_Section):
    """The rules engine (seed 004)."""

    enabled: bool = True
    trigger_threshold: float = Field(0.60, gt=0.0, le=1.0)
    protect_last_n_turns: int = Field(5, ge=0)
    max_tool_output_chars: int = Field(500, ge=0)
    keep_tool_summary: bool = True
    drop_system_after_turn: int = Field(1, ge=0, description="0 disables the rule.")
    collapse_consecutive_assistant: bool = True
    head_lines: int = Field(10, ge=0)
    tail_lines: int = Field(5, ge=0)
    target_ratio: float = Field(0.35, gt=0.0, lt=1.0, description="Compact down to this fraction of the window, so compactions come in batches.")
    fact_tokens: int = Field(400, ge=0, description="Verbatim facts one record lists when a store keeps the originals (the rest is one ctx_grep away); without a store every fact is listed.")
    min_gain: float = Field(0.0, ge=0.0, lt=1.0, description="A compaction freeing less than this share of the trigger is not done (0: always compact when triggered).")


class LcmConfig(_Section):
    """The lossless engine."""

    threshold: float = Field(0.75, gt=0.0, le=1.0)
    fresh_tail_messages: int = Field(16, ge=2)
    fresh_tail_ratio: float = Field(0.25, gt=0.0, lt=1.0)
    condense_after: int = Field(4, ge=2)
    leaf_target_tokens: int = Field(1200, ge=100)
    leaf_chunk_tokens: int = Field(20_000, ge=500, description="Largest span of originals one leaf summary node covers.")
    leaf_fact_tokens: int = Field(4000, ge=0, description="Verbatim paths, URLs, tool names and error lines a node shows; the rest stays retrievable with lcm_grep.")


class CacheAwareConfig(_Section):
    """The ``cacheaware`` engine (``cacheaware:``) and the compressor's digest mode; defaults
    measured on the long sessions and the 32K single runs of ../shared/data (DESIGN §3.8): the
    last 2 tool exchanges stay whole, older ones are folded in batches of 6 into digests of
    actions and facts, down to 25 % of the window when the context passes 55 %; a finished
    task is folded once a later one has begun."""

    keep_recent: int = Field(2, ge=0, description="Tool exchanges at the end kept whole (the agent is still using them).")
    batch: int = Field(6, ge=1, description="Compact once this many older whole outputs wait…")
    batch_tokens: int = Field(6000, ge=0, description="…or once they hold this many tokens.")
    cut_min_tokens: int = Field(120, ge=0, description="Outputs shorter than this are never cut.")
    fold_batches: bool = Field(True, description="Fold a due batch into a digest of actions and facts (off: cut each output to a record).")
    record_tokens: int = Field(160, ge=40, description="Size of one cut record (head and tail lines plus facts).")
    head_lines: int = Field(3, ge=0)
    tail_lines: int = Field(2, ge=0)
    digest_tokens: int = Field(300, ge=100, description="Size of one digest (actions, facts, assistant notes).")
    name_tokens: int = Field(150, ge=0, description="Room in one digest for the names its outputs gave the agent (ids, dates, amounts, a short listing's entries, what a viewed file defines), those it is most likely to use again first (0: none).")
    fact_tokens: int = Field(60, ge=0, description="Verbatim facts one record or digest lists when a store keeps the originals (the rest is one ctx_grep away); without a store every fact is listed.")
    giant_ratio: float = Field(0.08, gt=0.0, le=1.0, description="A new output larger than this share of the window is cut before it is sent.")
    giant_tokens: int = Field(1500, ge=100, description="Size a giant output is cut to.")
    fold_ratio: float = Field(0.55, gt=0.0, le=1.0, description="Fold old turns when the context passes this share of the window…")
    fold_target: float = Field(0.25, gt=0.0, lt=1.0, description="…down to this share.")
    fold_run_tokens: int = Field(2000, ge=0, description="When a new user turn begins, fold the previous turn's run if it holds this many tokens (0: off).")
    fold_tasks: bool = Field(True, description="With a store, once a later user turn has begun, fold the finished one (its run, and the user messages task_users names) into digests.")
    task_users: Literal["repeated", "all"] = Field("repeated", description="The finished turn's user messages folded with it: those sent again later (a harness's demonstration that comes with every task; the text stays in context), or all (the store keeps them).")
    fold_floor: float = Field(0.5, ge=0.0, le=1.0, description="Below this share of the window (or fold_floor_tokens, the smaller), nothing is folded unless the window requires it: the fold would save a few percent of a small session's cost and take away text the agent uses next.")
    fold_floor_tokens: int = Field(24_000, ge=0, description="The fold floor in tokens, for large windows: past it every call reads enough that folding pays (0: the share alone).")
    cost_aware: bool = Field(True, description="Compact a batch only when it pays for its cache rewrite.")
    min_horizon: int = Field(8, ge=1)
    min_gain: float = Field(0.02, ge=0.0, lt=1.0, description="A compaction freeing less than this share of the threshold is not done.")
    rewrite_every: int = Field(3, ge=0, description="At most one compaction that rewrites the cached prefix per this many turns, unless the window requires it.")


class StoreConfig(_Section):
    enabled: bool = True
    backend: Literal["sqlite", "postgres"] = "sqlite"
    path: str | None = Field(None, description="SQLite file; default: <user data dir>/ctxengine/sessions.db")
    dsn_env: str = Field("CTXENGINE_STORE_DSN", description="Environment variable holding the PostgreSQL DSN.")
    redact_content: bool = Field(False, description="Store messages with key shapes redacted (set by redaction.content).")


class RedactionConfig(_Section):
    """``redaction:``. Secrets in errors, logs, status and the store are always redacted;
    ``content`` also removes key shapes (``sk-…``, ``AKIA…``, ``ghp_…``, bearer tokens, URL
    credentials, the configured keys) from message content before it is summarized or stored."""

    content: bool = False


class ModelOverride(_Section):
    """One ``models.<name>`` entry: the model profile fields a config may override."""

    provider: str | None = None
    context_length: int | None = Field(None, gt=0)
    anthropic_cache: bool | None = None
    min_cache_tokens: int | None = Field(None, ge=0)
    input: float | None = Field(None, ge=0)
    output: float | None = Field(None, ge=0)
    openai_cached_discount: float | None = Field(None, ge=0, le=1)


class ProxyConfig(_Section):
    """``ctxengine proxy`` (the same keys as its command-line flags)."""

    host: str = "127.0.0.1"
    port: int = Field(8787, ge=0, le=65535)
    openai_base_url: str = Field("https://api.openai.com/v1", description="Upstream of /v1/chat/completions and other OpenAI paths (any OpenAI-compatible base URL, ending in /v1).")
    anthropic_base_url: str = Field("https://api.anthropic.com", description="Upstream of /v1/messages (the SDK-style base URL, without /v1).")
    gemini_base_url: str = Field(
        "https://generativelanguage.googleapis.com", description="Upstream of the Gemini API (/v1beta/models/…, /v1/models/…: the SDK-style base URL, without the version)."
    )
    auth_token_env: str = Field("CTXENGINE_PROXY_TOKEN", description="Environment variable holding the token clients must send (required when binding beyond loopback).")
    max_body_bytes: int = Field(32 * 1024 * 1024, gt=0, description="Larger request bodies get a 413.")
    recall_tools: bool = Field(True, description="Offer the engine's recall tools and answer them in the proxy (only when the client sends tools of its own).")
    max_tool_rounds: int = Field(3, ge=1, description="Extra upstream round trips per request for the engine's own tools.")
    inline_compaction_tokens: int = Field(
        0,
        ge=0,
        description=(
            "A turn whose compaction is local work (an engine that calls no model: digests, the extractive summary, rules) on at most this many "
            "tokens of messages is planned on the event loop with a local store, like a turn that only appends; larger ones, and every "
            "compaction that may call a model, go to a worker thread. 0 (the default): every compaction goes to a worker thread, so that "
            "one session's compaction never holds the other sessions' requests (a single session gains a little from e.g. 32000)."
        ),
    )
    timeout: float = Field(600.0, gt=0, description="Upstream timeout in seconds.")
    shadow: bool = Field(
        False,
        description=(
            "Forward every request unchanged and record what ctxengine would have sent (tokens, compactions) in the request log, "
            "planned after the response is out: the dashboard shows the savings before a team switches."
        ),
    )
    workers: int = Field(
        1,
        ge=1,
        description=(
            "Processes serving the port (more cores); they share each session through the session store (a file or a database), "
            "one turn of a session at a time. 1: a session's engine state stays in one process's memory."
        ),
    )
    session_idle_seconds: float = Field(
        3600.0, gt=0, description="A session idle this long is ended in memory (its record stays in the store; a returning client resumes from it)."
    )


class PluginsConfig(_Section):
    dirs: list[str] = Field(default_factory=list)
    entry_points: bool = True


class Config(_Section):
    """The whole configuration. Every section has the seeds' defaults."""

    context: ContextConfig = Field(default_factory=ContextConfig)
    compressor: CompressionConfig = Field(default_factory=CompressionConfig)
    auxiliary: AuxiliaryConfig = Field(default_factory=AuxiliaryConfig)
    prompt_caching: PromptCachingConfig = Field(default_factory=PromptCachingConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    models: dict[str, dict[str, Any]] = Field(default_factory=dict)
    rules: CompactionConfig = Field(default_factory=CompactionConfig)
    lcm: LcmConfig = Field(default_factory=LcmConfig)
    cacheaware: CacheAwareConfig = Field(default_factory=CacheAwareConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    proxy: ProxyConfig = Field(default_factory=ProxyConfig)
    plugins: PluginsConfig = Field(default_factory=PluginsConfig)
    redaction: RedactionConfig = Field(default_factory=RedactionConfig)
    source: str | None = Field(None, exclude=True, description="File the config was read from.")

    @model_validator(mode="before")
    @classmethod
    def _older_section_names(cls, data: Any) -> Any:
        return with_section_names(data) if isinstance(data, Mapping) else data

    @property
    def compression(self) -> CompressionConfig:
        """The ``compressor`` section under its older (seed) name."""
        return self.compressor

    @property
    def compaction(self) -> CompactionConfig:
        """The ``rules`` section under its older (seed 004) name."""
        return self.rules

    @field_validator("models", mode="before")
    @classmethod
    def _models_are_profiles(cls, v: Any) -> Any:
        """Each ``models.<name>`` is checked field by field now, so a misspelled key or a
        string window fails at load time instead of on the first request for that model."""
        if not isinstance(v, Mapping):
            return v
        out: dict[str, dict[str, Any]] = {}
        for key, val in v.items():
            if not isinstance(val, Mapping):
                raise ValueError(f"models.{key} must be a mapping of profile fields, not {type(val).__name__}")
            try:
                checked = ModelOverride.model_validate(dict(val), strict=True)
            except ValidationError as exc:
                problems = []
                for err in exc.errors():
                    loc = ".".join(str(x) for x in err["loc"])
                    if err["type"] == "extra_forbidden":
                        problems.append(f"unknown key 'models.{key}.{loc}' (allowed: {', '.join(sorted(ModelOverride.model_fields))})")
                    else:
                        problems.append(f"'models.{key}.{loc}': {err['msg']} (got {err.get('input')!r})")
                raise ValueError("; ".join(problems)) from None
            out[str(key)] = checked.model_dump(exclude_unset=True)
        return out

    @model_validator(mode="after")
    def _aliases(self) -> Config:
        # seed 000 put the summarizer model under compression.summary_model
        if self.compression.summary_model and not self.auxiliary.compression.model:
            self.auxiliary.compression.model = self.compression.summary_model
        if self.redaction.content:
            if not self.auxiliary.compression.redact_content:
                self.auxiliary.compression.redact_content = True
            if not self.store.redact_content:
                self.store.redact_content = True
        return self

    @property
    def cache_ttl(self) -> Literal["5m", "1h", "auto"]:
        """``prompt_caching.cache_ttl``, else the older ``model.cache_ttl``, else ``5m``."""
        return self.prompt_caching.cache_ttl or self.model.cache_ttl or "5m"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, source: str = "<config>") -> Config:
        """Validate a config mapping; errors name the key and the source."""
        data = dict(data or {})
        _reject_secrets(data, source, ())
        given = {new: old for old, new in SECTION_ALIASES.items() if old in data}
        try:
            cfg = cls.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(_explain(exc, source, given)) from exc
        cfg.source = source
        return cfg

    def with_overrides(self, **sections: Mapping[str, Any]) -> Config:
        """A copy with some sections' keys replaced: ``cfg.with_overrides(context={"engine": "rules"})``.

        Nested mappings are merged, not replaced, so
        ``with_overrides(auxiliary={"compression": {"model": "m"}})`` keeps the file's
        ``provider`` and ``base_url``. The result is validated like a loaded file.
        """
        data = self.model_dump()
        try:
            merged = with_section_names(sections)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        for old, new in SECTION_ALIASES.items():
            if old in sections and new not in sections:  # errors name the section as written
                data[old], merged[old] = data.pop(new), merged.pop(new)
        for name, values in merged.items():
            if name not in data or not isinstance(data[name], dict):
                raise ConfigError(f"unknown config section {name!r}")
            _merge(data[name], values)
        return Config.from_dict(data, self.source or "<config>")


SECTION_ALIASES: dict[str, str] = {"compression": "compressor", "compaction": "rules"}
"""Older names of engine sections (old -> engine name), accepted wherever a config is read."""


def with_section_names(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with each older section name (:data:`SECTION_ALIASES`) replaced by the engine's
    name; a section given under both names must be the same (``ValueError`` otherwise)."""
    out = dict(data)
    for old, new in SECTION_ALIASES.items():
        if old not in out:
            continue
        value = out.pop(old)
        if new in out and _plain(out[new]) != _plain(value):
            raise ValueError(f"'{old}' is the older name of the '{new}' section and both are given, with different keys: keep one")
        out.setdefault(new, value)
    return out


def _plain(value: Any) -> Any:
    return value.model_dump() if isinstance(value, BaseModel) else value


def _merge(into: dict[str, Any], values: Mapping[str, Any]) -> None:
    for key, val in values.items():
        if isinstance(val, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], val)
        else:
            into[key] = val


def _reject_secrets(data: Mapping[str, Any], source: str, path: tuple[str, ...]) -> None:
    for key, val in data.items():
        if key in ("api_key", "apikey", "password") and val:
            dotted = ".".join((*path, key))
            raise ConfigError(
                f"{source}: '{dotted}' must not hold a secret; set it in the environment "
                "(CTXENGINE_API_KEY, OPENAI_API_KEY, OPENROUTER_API_KEY, ANTHROPIC_API_KEY, or the "
                "variable named by auxiliary.compression.api_key_env)"
            )
        if isinstance(val, Mapping):
            _reject_secrets(val, source, (*path, str(key)))


def _explain(exc: ValidationError, source: str, given: Mapping[str, str] | None = None) -> str:
    """One line per error; ``given`` maps a section to the older name the file used for it, so
    an error names the key as written."""
    parts = []
    for err in exc.errors():
        path = [str(x) for x in err["loc"]]
        if path and given and path[0] in given:
            path[0] = given[path[0]]
        loc = ".".join(path)
        if err["type"] == "extra_forbidden":
            parts.append(f"unknown key '{loc}'")
        elif err["type"] == "value_error":
            msg = str(err["msg"]).removeprefix("Value error, ")
            parts.append(msg if msg.startswith(("unknown key", "'")) else f"'{loc}': {msg}")
        else:
            parts.append(f"'{loc}': {err['msg']} (got {err.get('input')!r})")
    return f"{source}: " + "; ".join(parts)


def load_config(path: str | Path | None = None) -> Config:
    """Load ``path`` (YAML). ``None`` gives the defaults (or ``$CTXENGINE_CONFIG`` if set)."""
    if path is None:
        env = os.environ.get("CTXENGINE_CONFIG")
        if not env:
            return Config()
        path = env
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"{p}: config file not found") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read config: {exc}") from exc
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{p}: invalid YAML{where}: {problem}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping, not {type(data).__name__}")
    return Config.from_dict(data, str(p))


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key given twice in one mapping.

    Plain YAML keeps the last value silently, so a second ``compression:`` block would drop
    every key of the first one without a word.
    """


def _mapping_without_duplicates(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # keys merged in with "<<" may be overridden on purpose
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first given on line {seen[key] + 1})", key_node.start_mark
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


_PROVIDER_KEYS = {
    "openai": "OPENAI_API_KEY",
    "openrouter": "OPENROUTER_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
    "nous": "NOUS_API_KEY",
    "deepseek": "DEEPSEEK_API_KEY",
}


def api_key_from_env(summarizer: SummarizerConfig, environ: Mapping[str, str] | None = None) -> str | None:
    """The API key for the summarizer: ``api_key_env`` if set, else ``CTXENGINE_API_KEY``, else
    the provider's conventional variable. ``None`` when none is set (local servers need none)."""
    env = os.environ if environ is None else environ
    if summarizer.api_key_env:
        return env.get(summarizer.api_key_env) or None
    if env.get("CTXENGINE_API_KEY"):
        return env["CTXENGINE_API_KEY"]
    var = _PROVIDER_KEYS.get(summarizer.provider.lower())
    return (env.get(var) or None) if var else None
