"""The directory variant of the Hermes plugin: ``plugins/context_engine/<name>/``.

Hermes Agent also finds context engines as directories (``__init__.py`` + ``plugin.yaml``) in
its ``plugins/context_engine/`` folder, without the plugin manager's opt-in list. The directory
written here holds no code of its own: its ``__init__.py`` re-exports the pip plugin's
``register``, so ctxengine must be installed in Hermes' environment either way.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from ctxengine.errors import ConfigError
from ctxengine.integrations.hermes.adapter import ENGINE_NAME

__all__ = ["hermes_plugins_dir", "write_plugin_dir"]

_INIT = '''"""ctxengine as Hermes Agent's context engine (written by `ctxengine hermes install-plugin`).

Select it with `context.engine: {name}` in Hermes' config.yaml; settings come from the
`ctxengine:` section there (engine, config_file, compression, store ...).
"""

from ctxengine.integrations.hermes.plugin import register

__all__ = ["register"]
'''

_MANIFEST = """name: {name}
description: ctxengine context engine (compaction that keeps user messages, facts and the prompt cache)
version: "{version}"
"""

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def hermes_plugins_dir() -> Path | None:
    """Hermes' own ``plugins/`` folder when Hermes is installed in this environment."""
    try:
        spec = importlib.util.find_spec("plugins.context_engine")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).parent


def write_plugin_dir(plugins_dir: Path, *, name: str = ENGINE_NAME, force: bool = False) -> Path:
    """Write ``plugins_dir/context_engine/<name>/`` and return it.

    An existing directory that this function did not write is left alone unless ``force``.
    """
    if not _NAME.match(name):
        raise ConfigError(f"plugin name {name!r} must be letters, digits, '_', '-' or '.'")
    if name != ENGINE_NAME:
        raise ConfigError(f"the engine registers itself as {ENGINE_NAME!r}; the directory must carry that name (got {name!r})")
    if plugins_dir.name == "context_engine":
        plugins_dir = plugins_dir.parent
    target = plugins_dir / "context_engine" / name
    init = target / "__init__.py"
    if init.exists() and not force and "ctxengine hermes install-plugin" not in init.read_text(encoding="utf-8", errors="replace"):
        raise ConfigError(f"{target} exists and was not written by ctxengine; pass --force to replace it")
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("ctxengine")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        ver = "0"
    target.mkdir(parents=True, exist_ok=True)
    init.write_text(_INIT.format(name=name), encoding="utf-8")
    (target / "plugin.yaml").write_text(_MANIFEST.format(name=name, version=ver), encoding="utf-8")
    return target
