"""ctxengine: keep an LLM agent's conversation inside its context window without losing what
matters, at the lowest cost prompt caching allows.

The public surface is re-exported here; ``import ctxengine`` pulls in no optional dependency.
"""

from ctxengine.anthropic_adapter import anthropic_to_openai, openai_to_anthropic
from ctxengine.boundaries import align_cut, group_spans, sanitize_tool_pairs
from ctxengine.caching import apply_anthropic_cache_control, caching_status, plan_breakpoints
from ctxengine.config import Config, load_config
from ctxengine.engine import CompactionReport, ContextEngine, Usage, normalize_usage
from ctxengine.engines.cacheaware import CacheAwareEngine
from ctxengine.engines.compressor import ContextCompressor
from ctxengine.engines.lcm import LcmEngine
from ctxengine.engines.rules import RulesEngine
from ctxengine.errors import (
    ConfigError,
    ContextWindowError,
    CtxEngineError,
    EngineError,
    EngineStartError,
    InputError,
    InvalidMessages,
    NotFoundError,
    PluginError,
    StoreError,
    SummarizerAuthError,
    SummarizerContextError,
    SummarizerError,
    TokenizerError,
)
from ctxengine.facts import Facts, extract_facts
from ctxengine.io import Session, read_sessions
from ctxengine.manager import ContextManager
from ctxengine.messages import Violation, check, content_text, message_text, validate
from ctxengine.models import ModelProfile, UnknownModelWarning, resolve_model
from ctxengine.registry import EngineRegistry, create_engine
from ctxengine.store import open_store
from ctxengine.store.base import SessionStore
from ctxengine.store.sqlite import SqliteStore
from ctxengine.tokens import (
    AnchoredCounter,
    ExactCounter,
    estimate,
    estimate_messages_tokens,
    estimate_messages_tokens_rough,
    exact,
)

__version__ = "0.1.0"

__all__ = [
    "AnchoredCounter",
    "CacheAwareEngine",
    "CompactionReport",
    "Config",
    "ConfigError",
    "ContextCompressor",
    "ContextEngine",
    "ContextManager",
    "ContextWindowError",
    "CtxEngineError",
    "EngineError",
    "EngineRegistry",
    "EngineStartError",
    "ExactCounter",
    "Facts",
    "InputError",
    "InvalidMessages",
    "LcmEngine",
    "ModelProfile",
    "NotFoundError",
    "PluginError",
    "RulesEngine",
    "Session",
    "SessionStore",
    "SqliteStore",
    "StoreError",
    "SummarizerAuthError",
    "SummarizerContextError",
    "SummarizerError",
    "TokenizerError",
    "UnknownModelWarning",
    "Usage",
    "Violation",
    "__version__",
    "align_cut",
    "anthropic_to_openai",
    "apply_anthropic_cache_control",
    "caching_status",
    "check",
    "content_text",
    "create_engine",
    "estimate",
    "estimate_messages_tokens",
    "estimate_messages_tokens_rough",
    "exact",
    "extract_facts",
    "group_spans",
    "load_config",
    "message_text",
    "normalize_usage",
    "open_store",
    "openai_to_anthropic",
    "plan_breakpoints",
    "read_sessions",
    "resolve_model",
    "sanitize_tool_pairs",
    "validate",
]
