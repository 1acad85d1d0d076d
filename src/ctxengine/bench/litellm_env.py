"""The LiteLLM proxy from PyPI in a venv of its own, and a LiteLLM proxy process naming
ctxengine's hook, for the tests and the benchmark of :mod:`ctxengine.integrations.litellm`.

LiteLLM pins its own dependencies (``rich<14`` against import-linter's ``rich>=14.2``, newer
``boto3``/``click``/``httpx``), so it never goes into ctxengine's test environment: the venv
holds ``litellm[proxy]`` and this checkout installed editable with the ``litellm`` extra, keyed
by the Python version and a hash of ``pyproject.toml`` (:func:`ensure_litellm_venv`; about
100 s to build). :func:`litellm_python` finds a python that has it; :class:`LiteLLMProxy` runs
``litellm --config`` with it on 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ctxengine.bench.venvs import VenvUnavailable, ensure_venv, venv_python

__all__ = [
    "LITELLM_SPEC",
    "Deployment",
    "LiteLLMEnvUnavailable",
    "LiteLLMProxy",
    "ensure_litellm_venv",
    "litellm_config",
    "litellm_python",
    "venv_dir",
]

LITELLM_SPEC = "litellm[proxy]>=1.80,<2"
"""What the venv installs beside ``ctxengine[litellm]``: the proxy's server and its parts."""

HOOK = "ctxengine.integrations.litellm.ctxengine_hook"
"""How a LiteLLM config names ctxengine's hook (``litellm_settings.callbacks``)."""


class LiteLLMEnvUnavailable(VenvUnavailable):
    """No python with the LiteLLM proxy: the message says why and how to build one."""


def venv_dir(cache_dir: Path, source: Path) -> Path:
    """Where the venv of checkout ``source`` lives under ``cache_dir``."""
    digest = hashlib.sha256((source / "pyproject.toml").read_bytes()).hexdigest()[:10]
    return cache_dir / f"litellm-py{sys.version_info.major}{sys.version_info.minor}-ctxengine-{digest}"


def ensure_litellm_venv(cache_dir: Path, source: Path, *, force: bool = False) -> Path:
    """The python of the venv (built when missing); :class:`LiteLLMEnvUnavailable` if pip fails."""
    return ensure_venv(
        venv_dir(cache_dir, source),
        [["-e", f"{source}[litellm]", LITELLM_SPEC]],
        ready_text=LITELLM_SPEC,
        force=force,
        error=LiteLLMEnvUnavailable,
        stale="litellm-py*-ctxengine-*",
    )


def litellm_python(cache_dir: Path, source: Path) -> Path:
    """A python that runs the LiteLLM proxy with this checkout's hook: ``$CTXENGINE_LITELLM_PYTHON``,
    else this interpreter when it has ``litellm`` and its proxy server, else the venv when built;
    never builds it (:class:`LiteLLMEnvUnavailable` says how)."""
    env = os.environ.get("CTXENGINE_LITELLM_PYTHON")
    if env:
        if not Path(env).exists():
            raise LiteLLMEnvUnavailable(f"CTXENGINE_LITELLM_PYTHON={env} does not exist")
        return Path(env)
    if importlib.util.find_spec("litellm") is not None and importlib.util.find_spec("fastapi") is not None:
        return Path(sys.executable)
    target = venv_dir(cache_dir, source)
    if (target / ".ready").is_file():
        return venv_python(target)
    raise LiteLLMEnvUnavailable(f"litellm is not importable here and no LiteLLM venv is built at {target}: run `python scripts/litellm_env.py`")


@dataclass(frozen=True, slots=True)
class Deployment:
    """One entry of a LiteLLM ``model_list``: the public ``name``, the provider ``model``
    (``openai/…``, ``anthropic/…``), its ``api_base`` and window (``model_info.max_input_tokens``)."""

    name: str
    model: str
    api_base: str
    window: int | None = None


def litellm_config(deployments: Sequence[Deployment], *, master_key: str, hook: bool = True) -> str:
    """A LiteLLM proxy config (YAML) serving ``deployments``; ``hook``: naming ctxengine's hook."""
    import yaml

    models: list[dict[str, Any]] = []
    for d in deployments:
        entry: dict[str, Any] = {"model_name": d.name, "litellm_params": {"model": d.model, "api_base": d.api_base, "api_key": "sk-upstream"}}
        if d.window is not None:
            entry["model_info"] = {"max_input_tokens": d.window}
        models.append(entry)
    config: dict[str, Any] = {"model_list": models, "general_settings": {"master_key": master_key}}
    if hook:
        config["litellm_settings"] = {"callbacks": HOOK}
    return yaml.safe_dump(config, sort_keys=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LiteLLMProxy:
    """``litellm --config CONFIG`` run by ``python`` on 127.0.0.1 (a free port), its output to
    ``log``; ``env`` adds to the environment (``CTXENGINE_CONFIG`` …). LiteLLM's model cost map
    is read from its package, never fetched. Waits for ``/health/liveliness``; stops on exit."""

    def __init__(self, python: Path, config: Path, log: Path, env: Mapping[str, str] | None = None, *, start_timeout: float = 120.0) -> None:
        self.python, self.config, self.log = python, config, log
        self.env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False", **(env or {})}
        self.start_timeout = start_timeout
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._out: IO[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LiteLLMProxy:
        self.port = _free_port()
        self._out = open(self.log, "ab")  # noqa: SIM115 (closed in stop)
        cmd = [str(self.python), "-c", "from litellm.proxy.proxy_cli import run_server; run_server()", "--config", str(self.config), "--host", "127.0.0.1", "--port", str(self.port)]
        self._proc = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.STDOUT, env=self.env, cwd=self.config.parent)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"the LiteLLM proxy exited with {self._proc.returncode}: {self.tail()}")
            try:
                with urllib.request.urlopen(self.base_url + "/health/liveliness", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"the LiteLLM proxy did not answer within {self.start_timeout:.0f} s: {self.tail()}")

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text("utf-8", "replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if self._out is not None:
            self._out.close()
            self._out = None

    def __enter__(self) -> LiteLLMProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

