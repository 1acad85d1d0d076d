"""ctxengine: keep an LLM agent's conversation inside its context window without losing what
matters, at the lowest cost prompt caching allows.

The public surface is re-exported here; ``import ctxengine`` pulls in no optional dependency.
"""

from ctxengine.boundaries import align_cut, group_spans, sanitize_tool_pairs
from ctxengine.config import Config, load_config
from ctxengine.engine import CompactionReport, ContextEngine, Usage, normalize_usage
from ctxengine.errors import (
    ConfigError,
    CtxEngineError,
    EngineError,
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
from ctxengine.messages import Violation, check, content_text, message_text, validate
from ctxengine.models import ModelProfile, resolve_model
from ctxengine.registry import EngineRegistry, create_engine
from ctxengine.tokens import (
    AnchoredCounter,
    ExactCounter,
    estimate,
    estimate_messages_tokens_rough,
    exact,
)

__version__ = "0.1.0"

__all__ = [
    "AnchoredCounter",
    "CompactionReport",
    "Config",
    "ConfigError",
    "ContextEngine",
    "CtxEngineError",
    "EngineError",
    "EngineRegistry",
    "ExactCounter",
    "Facts",
    "InputError",
    "InvalidMessages",
    "ModelProfile",
    "NotFoundError",
    "PluginError",
    "Session",
    "StoreError",
    "SummarizerAuthError",
    "SummarizerContextError",
    "SummarizerError",
    "TokenizerError",
    "Usage",
    "Violation",
    "__version__",
    "align_cut",
    "check",
    "content_text",
    "create_engine",
    "estimate",
    "estimate_messages_tokens_rough",
    "exact",
    "extract_facts",
    "group_spans",
    "load_config",
    "message_text",
    "normalize_usage",
    "read_sessions",
    "resolve_model",
    "sanitize_tool_pairs",
    "validate",
]
