"""A virtualenv built once and cached, for a large application that never goes into ctxengine's
own environment (Hermes Agent, the LiteLLM proxy): :func:`ensure_venv`.

It is built in place and marked ready only once every install succeeded, so a half-built venv
is rebuilt, never used. A lock file keeps two processes from building the same venv at once.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from ctxengine.errors import CtxEngineError

__all__ = ["INSTALL_TIMEOUT_S", "VenvUnavailable", "ensure_venv", "venv_python"]

INSTALL_TIMEOUT_S = 900


class VenvUnavailable(CtxEngineError):
    """A venv could not be built; the message says why (pip's last lines)."""


def venv_python(d: Path) -> Path:
    return d / "bin" / "python"


def _run(cmd: list[str], what: str, error: type[VenvUnavailable]) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise error(f"{what} failed: {exc}") from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
        raise error(f"{what} failed (exit {proc.returncode}): {tail}")


def ensure_venv(
    target: Path,
    installs: Sequence[Sequence[str]],
    *,
    ready_text: str,
    force: bool = False,
    error: type[VenvUnavailable] = VenvUnavailable,
    stale: str | None = None,
) -> Path:
    """The python of the venv at ``target``, built when missing (or ``force``): one
    ``pip install`` per entry of ``installs`` (its arguments). Raises ``error`` when pip fails.
    ``stale``: a glob of older venvs beside ``target`` removed once this one is ready."""
    ready = target / ".ready"
    if ready.is_file() and venv_python(target).exists() and not force:
        return venv_python(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready.is_file() and venv_python(target).exists() and not force:
            return venv_python(target)
        shutil.rmtree(target, ignore_errors=True)
        try:
            _run([sys.executable, "-m", "venv", str(target)], "creating the venv", error)
            pip = [str(venv_python(target)), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
            for args in installs:
                _run([*pip, *args], "pip install " + " ".join(args), error)
        except VenvUnavailable:
            shutil.rmtree(target, ignore_errors=True)
            raise
        ready.write_text(ready_text + "\n", encoding="utf-8")
        if stale is not None:
            for old in target.parent.glob(stale):
                if old != target and old.is_dir():
                    shutil.rmtree(old, ignore_errors=True)
        return venv_python(target)
