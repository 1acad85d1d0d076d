"""A separate virtualenv holding Hermes Agent from PyPI, built once and cached.

Hermes Agent is a large application with its own pinned dependencies; it never goes into
ctxengine's environment. The ``hermes`` bench baseline runs Hermes' own compressor in a
subprocess of this venv, and the Hermes tests run Hermes' plugin manager and agent loop there.

The venv is keyed by the Hermes version, the Python version and (when ctxengine is installed
into it editable, for the tests) a hash of ``pyproject.toml``. It is built in place and marked
ready only once every install succeeded, so a half-built venv is rebuilt, never used. A lock
file keeps two processes from building the same venv at once.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path

from ctxengine.bench.venvs import VenvUnavailable, ensure_venv, venv_python

__all__ = ["HERMES_VERSION", "HermesEnvUnavailable", "default_cache_dir", "ensure_hermes_venv", "hermes_python", "venv_dir"]

HERMES_VERSION = "0.19.0"
"""The ``hermes-agent`` release the baseline and tests use (``CTXENGINE_HERMES_VERSION`` overrides)."""

class HermesEnvUnavailable(VenvUnavailable):
    """The Hermes venv could not be built or found; the message says why."""


def default_cache_dir() -> Path:
    """``$CTXENGINE_HERMES_VENV_CACHE``, else ``<user cache dir>/ctxengine/hermes-venv``."""
    env = os.environ.get("CTXENGINE_HERMES_VENV_CACHE")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("ctxengine")) / "hermes-venv"


def _version() -> str:
    return os.environ.get("CTXENGINE_HERMES_VERSION") or HERMES_VERSION


def venv_dir(version: str | None = None, *, cache_dir: Path | None = None, ctxengine_source: Path | None = None) -> Path:
    """Where the venv for ``version`` lives (``ctxengine_source``: a checkout installed editable)."""
    version = version or _version()
    py = f"py{sys.version_info.major}{sys.version_info.minor}"
    name = f"hermes-{version}-{py}"
    if ctxengine_source is not None:
        digest = hashlib.sha256((ctxengine_source / "pyproject.toml").read_bytes()).hexdigest()[:10]
        name += f"-ctxengine-{digest}"
    return (cache_dir or default_cache_dir()) / name


def _python(d: Path) -> Path:
    return venv_python(d)


def ensure_hermes_venv(
    version: str | None = None,
    *,
    cache_dir: Path | None = None,
    ctxengine_source: Path | None = None,
    force: bool = False,
) -> Path:
    """The python executable of a venv with ``hermes-agent==version``, built when missing.

    ``ctxengine_source``: also install that checkout editable with the ``hermes`` extra (the
    plugin's entry point), as the tests need. Raises :class:`HermesEnvUnavailable` when pip
    fails (no package index, say), with pip's last lines.
    """
    version = version or _version()
    target = venv_dir(version, cache_dir=cache_dir, ctxengine_source=ctxengine_source)
    installs = [[f"hermes-agent=={version}"]]
    if ctxengine_source is not None:
        installs.append(["-e", f"{ctxengine_source}[hermes]"])
    # venvs of an older pyproject.toml are never used again
    stale = "hermes-*-ctxengine-*" if ctxengine_source is not None else None
    return ensure_venv(target, installs, ready_text=f"hermes-agent=={version}", force=force, error=HermesEnvUnavailable, stale=stale)


def hermes_python(*, build: bool = True) -> Path:
    """A python that can import Hermes' compressor: ``$CTXENGINE_HERMES_PYTHON``, else this
    interpreter when Hermes is installed here, else the cached venv (built when ``build``)."""
    env = os.environ.get("CTXENGINE_HERMES_PYTHON")
    if env:
        if not Path(env).exists():
            raise HermesEnvUnavailable(f"CTXENGINE_HERMES_PYTHON={env} does not exist")
        return Path(env)
    try:
        here = importlib.util.find_spec("agent.context_compressor") is not None
    except (ImportError, ValueError):
        here = False
    if here:
        return Path(sys.executable)
    target = venv_dir()
    if (target / ".ready").is_file():
        return _python(target)
    if not build:
        raise HermesEnvUnavailable(f"no Hermes venv at {target}")
    return ensure_hermes_venv()
