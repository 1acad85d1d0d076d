"""The public surface: ``ctxengine.__all__`` is pinned, sorted, importable, and light."""

from __future__ import annotations

import json
import subprocess
import sys

import ctxengine

# Changing the public surface is a decision: update this list on purpose.
EXPECTED_ALL = [
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

HEAVY = ["click", "openai", "anthropic", "psycopg", "tiktoken", "matplotlib", "starlette"]


def test_all_is_pinned_and_sorted() -> None:
    assert sorted(ctxengine.__all__) == ctxengine.__all__
    assert ctxengine.__all__ == EXPECTED_ALL
    assert len(set(ctxengine.__all__)) == len(ctxengine.__all__)


def test_every_public_name_is_importable() -> None:
    for name in ctxengine.__all__:
        assert getattr(ctxengine, name) is not None, name
    namespace: dict[str, object] = {}
    exec("from ctxengine import *", namespace)
    assert set(EXPECTED_ALL) <= set(namespace)


def test_version_is_a_string() -> None:
    assert isinstance(ctxengine.__version__, str)
    assert ctxengine.__version__.count(".") >= 1


def test_import_pulls_in_no_optional_dependency() -> None:
    code = (
        "import json, sys\n"
        "import ctxengine\n"
        f"heavy = {HEAVY!r}\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(out.stdout) == []


def test_the_check_itself_can_see_a_heavy_import() -> None:
    # guards the test above against a subprocess that silently imports nothing
    code = "import json, sys\nimport ctxengine, click\nprint(json.dumps('click' in sys.modules))\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(out.stdout) is True
