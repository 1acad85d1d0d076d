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

import fcntl
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ctxengine.errors import CtxEngineError

__all__ = ["HERMES_VERSION", "HermesEnvUnavailable", "default_cache_dir", "ensure_hermes_venv", "hermes_python", "venv_dir"]

HERMES_VERSION = "0.19.0"
"""The ``hermes-agent`` release the baseline and tests use (``CTXENGINE_HERMES_VERSION`` overrides)."""

_INSTALL_TIMEOUT_S = 900


class HermesEnvUnavailable(CtxEngineError):
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
    return d / "bin" / "python"


def _run(cmd: list[str], what: str) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_INSTALL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HermesEnvUnavailable(f"{what} failed: {exc}") from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
        raise HermesEnvUnavailable(f"{what} failed (exit {proc.returncode}): {tail}")


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
    ready = target / ".ready"
    if ready.is_file() and _python(target).exists() and not force:
        return _python(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready.is_file() and _python(target).exists() and not force:
            return _python(target)
        shutil.rmtree(target, ignore_errors=True)
        try:
            _run([sys.executable, "-m", "venv", str(target)], "creating the venv")
            pip = [str(_python(target)), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
            _run([*pip, f"hermes-agent=={version}"], f"pip install hermes-agent=={version}")
            if ctxengine_source is not None:
                _run([*pip, "-e", f"{ctxengine_source}[hermes]"], "pip install -e ctxengine[hermes]")
        except HermesEnvUnavailable:
            shutil.rmtree(target, ignore_errors=True)
            raise
        ready.write_text(f"hermes-agent=={version}\n", encoding="utf-8")
        if ctxengine_source is not None:  # venvs of an older pyproject.toml are never used again
            for old in target.parent.glob("hermes-*-ctxengine-*"):
                if old != target and old.is_dir():
                    shutil.rmtree(old, ignore_errors=True)
        return _python(target)


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
