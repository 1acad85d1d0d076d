#!/usr/bin/env python
"""Real agent clients through ``ctxengine proxy`` against a strict scripted upstream.

    python scripts/bench_clients.py --install                      # once: npm + one venv per client
    python scripts/bench_clients.py                                 # every client, windows 16000,40000
    python scripts/bench_clients.py --clients claude,codex --window 40000 --json out.json
    python scripts/bench_clients.py --direct --clients llm          # no proxy: record what it sends

Not part of the CI suite: it installs large packages into ``.bench-clients/`` (gitignored) under
the repository (npm ``--prefix``, one virtualenv per Python client) and runs real programs.

Per client and window: a temp folder with the task's files, the strict upstream
(:mod:`ctxengine.testing.strict_upstream`: it plays the task with the client's own tools and
rejects what a provider rejects), and ``python -m ctxengine proxy`` in a subprocess with a temp
config (upstream base URLs pointing at the strict upstream, a temp SQLite store,
``model.context_length``) and ``--model-window '*=WINDOW'`` where that proxy has the flag. The
client runs the task under a timeout; half way through (when the upstream has asked for file
``steps // 2``) the proxy is stopped (SIGTERM) and started again on the same port and store while
that step's tool runs slowly (a ``sleep`` in the shell command, or in the bench's own read_file
tool), so the next request meets a fresh process. aider sends no tools (nothing to slow down) and
reads 3 files (it follows at most 3 "add this file" replies per message): it is paused (SIGSTOP)
from the upstream's answer to step 2 until the proxy is up again (SIGCONT). Every LLM call goes to 127.0.0.1; the
clients' telemetry and update checks are turned off through their environment and config.

Columns: ``done`` the task finished (the upstream sent its final answer); ``steps`` files read;
``reqs`` task requests that reached the upstream; ``bad`` requests the upstream rejected (over
the window, tool call/result mismatch, altered thinking/reasoning; by reason); ``compact``
compactions the proxy logged; ``inline`` the share of the task's requests the proxy planned on
its event loop (a turn that only appends: no compaction, cut or store write on the way); ``upstream`` input tokens the upstream received (o200k, as the
strict upstream counts: system, messages and the tool list); ``sent`` what the client sent: that
plus what the proxy removed (its own logged tokens_in - tokens_out, summed over requests);
``saved`` the removed share of ``sent``; ``fixed`` the share of ``sent`` that no compaction may
change (the tool definitions, system/developer prompts and user messages the client resends every
turn: Codex's are ~8K tokens a request), ``rest`` the removed share of the rest (``--json`` also
lists each request's tokens, fixed part and tool outputs sent whole or cut); ``recall`` recall calls answered with the right text /
made (the upstream asks ``ctx_grep`` for part01's code once the proxy offers it); ``kept`` the
session kept its proxy key across the restart and its first request there was no larger than
the last before plus two files (resumed, not rebuilt), with the restart's duration; ``reread`` (with ``--reread``) whether part02.txt's content was in the
request after the client answered its second read of it (Claude Code: "unchanged since your last
Read"), or ``gone``. Codex does
not get the window: like a user relying on the proxy, its config names no
``model_context_window``, so it never compacts by itself. A client that failed to install or
crashed is a row with the reason.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
sys.path.insert(0, str(SRC))

from ctxengine.testing.strict_upstream import StrictUpstream, Task, count_request_tokens  # noqa: E402

CACHE = ROOT / ".bench-clients"
SLOW_SECONDS = 15.0  # the tool of the restart step runs this long: the proxy's stop + start fits
PROXY_SRC = SRC  # --proxy-src: run another checkout's proxy (read only: no bytecode written there)
PROXY_DEBUG = False  # --proxy-debug: the proxy logs at debug level
CODEX_OUTPUT_TOKENS: int | None = None  # --codex-output-tokens: Codex's tool_output_token_limit
REREAD = False  # --reread: the task asks for file 2 again two files before the end (see Task.reread)
PROXY_MODE: str | None = None  # --mode: the proxy's compression.mode (None: its default)
PROXY_CONFIG = ""  # --proxy-config: YAML sections appended to the proxy's config
NPM = CACHE / "npm"

NPM_PACKAGES = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex"}
PY_PACKAGES = {
    "agents": ["openai-agents"],
    "llm": ["llm"],
    "langgraph": ["langgraph", "langchain-openai"],
    "aider": ["aider-chat"],
}
ALL_CLIENTS = ["claude", "codex", "agents-responses", "agents-chat", "llm", "langgraph", "aider"]
PAUSED_CLIENTS = frozenset({"aider"})  # no tool to slow down: paused while the proxy restarts
VENV_OF = {
    "agents-responses": "agents",
    "agents-chat": "agents",
    "llm": "llm",
    "langgraph": "langgraph",
    "aider": "aider",
}

# Environment every client gets: no telemetry, no update checks, no proxies, nothing but loopback.
QUIET_ENV = {
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_BUG_COMMAND": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
    "OPENAI_AGENTS_DISABLE_TRACING": "1",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_TELEMETRY": "False",
    "AIDER_ANALYTICS": "false",
    "AIDER_CHECK_UPDATE": "false",
    "LANGCHAIN_TRACING_V2": "false",
    "LANGSMITH_TRACING": "false",
    "DO_NOT_TRACK": "1",
    "NO_COLOR": "1",
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
    "PYTHONUNBUFFERED": "1",
}
DROP_ENV = (
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "ALL_PROXY",
    "https_proxy",
    "http_proxy",
    "all_proxy",
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "OPENAI_BASE_URL",
    "ANTHROPIC_BASE_URL",
)


# --------------------------------------------------------------------------- install


def install(clients: list[str]) -> dict[str, str]:
    """Install what ``clients`` need into CACHE; returns client -> "ok" or the failure."""
    CACHE.mkdir(exist_ok=True)
    status: dict[str, str] = {}
    npm_wanted = [NPM_PACKAGES[c] for c in clients if c in NPM_PACKAGES]
    if npm_wanted:
        NPM.mkdir(exist_ok=True)
        r = _run_logged(
            [
                "npm",
                "install",
                "--prefix",
                str(NPM),
                "--no-audit",
                "--no-fund",
                "--no-update-notifier",
                *npm_wanted,
            ],
            CACHE / "install-npm.log",
            900,
        )
        for c in clients:
            if c in NPM_PACKAGES:
                status[c] = (
                    "ok"
                    if r == 0 and (NPM / "node_modules" / ".bin" / c).exists()
                    else f"npm install failed (see {CACHE / 'install-npm.log'})"
                )
    for venv in sorted({VENV_OF[c] for c in clients if c in VENV_OF}):
        d = CACHE / f"venv-{venv}"
        log = CACHE / f"install-{venv}.log"
        r = 0
        if not (d / "bin" / "python").exists():
            r = _run_logged([sys.executable, "-m", "venv", str(d)], log, 300)
        if r == 0:
            r = _run_logged(
                [str(d / "bin" / "python"), "-m", "pip", "install", "-q", *PY_PACKAGES[venv]],
                log,
                1800,
            )
        for c in clients:
            if VENV_OF.get(c) == venv:
                status[c] = "ok" if r == 0 else f"pip install failed (see {log})"
    (CACHE / "install-status.json").write_text(json.dumps(status, indent=1))
    return status


def _run_logged(cmd: list[str], log: Path, timeout: float) -> int:
    with log.open("a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        try:
            return subprocess.run(
                cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, check=False
            ).returncode
        except (OSError, subprocess.TimeoutExpired) as exc:
            f.write(f"{exc}\n")
            return -1


def installed(client: str) -> str | None:
    """None when ``client`` is installed, else why not."""
    if client in NPM_PACKAGES:
        exe = NPM / "node_modules" / ".bin" / client
        return None if exe.exists() else f"not installed ({exe} missing: run --install)"
    venv = CACHE / f"venv-{VENV_OF[client]}" / "bin" / "python"
    return None if venv.exists() else f"not installed ({venv} missing: run --install)"


# --------------------------------------------------------------------------- the proxy


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_HELP: dict[str, str] = {}


def _proxy_has_flag(src: Path, flag: str, env: dict[str, str]) -> bool:
    """Whether that checkout's ``ctxengine proxy`` takes ``flag`` (older ones have no --model-window)."""
    if str(src) not in _HELP:
        r = subprocess.run(
            [sys.executable, "-m", "ctxengine", "proxy", "--help"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        _HELP[str(src)] = r.stdout
    return flag in _HELP[str(src)]


class Proxy:
    """``python -m ctxengine proxy`` in a subprocess; restartable on the same port and store."""

    def __init__(
        self, workdir: Path, upstream: StrictUpstream, window: int, engine: str | None = None
    ) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.config = workdir / "ctxengine.yaml"
        self.config.write_text(
            "model:\n"
            f"  context_length: {window}\n"
            "store:\n"
            f"  path: {workdir / 'sessions.db'}\n"
            "proxy:\n"
            f"  openai_base_url: {upstream.openai_base_url}\n"
            f"  anthropic_base_url: {upstream.anthropic_base_url}\n"
            "  timeout: 120\n"
            + (f"compression:\n  mode: {PROXY_MODE}\n" if PROXY_MODE else "")
            + PROXY_CONFIG
        )
        self.engine = engine
        self.window = window
        self.src = PROXY_SRC
        self.log = workdir / "proxy.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.lives = 0
        self.restart_error: str | None = None

    @property
    def openai_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k not in DROP_ENV}
        env["PYTHONPATH"] = str(self.src) + (
            os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
        )
        env["NO_PROXY"] = "127.0.0.1,localhost"
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        cmd = [
            sys.executable,
            "-m",
            "ctxengine",
            *(["-vv"] if PROXY_DEBUG else []),
            "proxy",
            "--port",
            str(self.port),
            "--config",
            str(self.config),
            "--log-format",
            "json",
        ]
        if _proxy_has_flag(self.src, "--model-window", env):
            cmd += ["--model-window", f"*={self.window}"]  # else config model.context_length
        if self.engine:
            cmd += ["--engine", self.engine]
        f = self.log.open("ab")
        f.write(f"--- proxy life {self.lives + 1} {time.time():.3f}\n".encode())
        f.flush()
        self.proc = subprocess.Popen(
            cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self.lives += 1
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"proxy exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}"
                )
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2) as r,
            ):
                if r.status == 200:
                    return
            time.sleep(0.1)
        raise RuntimeError("proxy did not answer /healthz within 60 s")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)

    def restart(self) -> None:
        try:
            self.stop()
            self.start()
        except Exception as exc:  # a failed restart is a finding, not a crash
            self.restart_error = f"{type(exc).__name__}: {exc}"

    def requests(self) -> list[tuple[int, dict[str, Any]]]:
        """(life, the log's "request" line) of every request the proxy served."""
        out: list[tuple[int, dict[str, Any]]] = []
        life = 0
        if not self.log.exists():
            return out
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("--- proxy life"):
                life += 1
                continue
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                if isinstance(rec, dict) and rec.get("msg") == "request":
                    out.append((life, rec))
        return out

    def problems(self) -> list[str]:
        """Warnings and errors the proxy logged (fail-open, store errors …)."""
        out: list[str] = []
        if not self.log.exists():
            return out
        for line in self.log.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                if isinstance(rec, dict) and rec.get("level") in ("warning", "error", "critical"):
                    out.append(
                        f"{rec.get('msg')}: {rec.get('error') or rec.get('reason') or ''}"[:300]
                    )
        return out


# --------------------------------------------------------------------------- the clients

AGENTS_RUNNER = r'''
import asyncio, os, sys, time
from openai import AsyncOpenAI
from agents import Agent, Runner, function_tool, set_tracing_disabled, OpenAIChatCompletionsModel, OpenAIResponsesModel
set_tracing_disabled(True)

@function_tool
def read_file(path: str) -> str:
    """Read a text file and return its whole content."""
    if os.environ.get("BENCH_SLOW") and path.endswith(os.environ["BENCH_SLOW"]):
        time.sleep(float(os.environ.get("BENCH_SLOW_SECONDS", "6")))
    with open(path, encoding="utf-8") as f:
        return f.read()

client = AsyncOpenAI(base_url=os.environ["BENCH_OPENAI_URL"], api_key="sk-bench-key", max_retries=6)
mode = sys.argv[1]
model = OpenAIResponsesModel("gpt-4.1", client) if mode == "responses" else OpenAIChatCompletionsModel("gpt-4.1", client)
agent = Agent(name="bench", instructions="You are a careful assistant that reads files with read_file.", tools=[read_file], model=model)

async def main():
    if mode == "responses":
        result = Runner.run_streamed(agent, os.environ["BENCH_PROMPT"], max_turns=200)
        async for _ in result.stream_events():
            pass
        print(result.final_output)
    else:
        result = await Runner.run(agent, os.environ["BENCH_PROMPT"], max_turns=200)
        print(result.final_output)

asyncio.run(main())
'''

LANGGRAPH_RUNNER = r'''
import os, time
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent

@tool
def read_file(path: str) -> str:
    """Read a text file and return its whole content."""
    if os.environ.get("BENCH_SLOW") and path.endswith(os.environ["BENCH_SLOW"]):
        time.sleep(float(os.environ.get("BENCH_SLOW_SECONDS", "6")))
    with open(path, encoding="utf-8") as f:
        return f.read()

def make(i):
    def fn(query: str, limit: int = 10, region: str = "eu-west-1", include_archived: bool = False) -> str:
        return f"no records for {query}"
    fn.__name__ = f"lookup_service_{i:02d}"
    fn.__doc__ = (f"Look up records in internal service number {i}: customers, invoices, shipments, tickets and audit "
                  "events. Use it when the user asks about data kept by that service. query is a free-text search; "
                  "limit caps the records returned; region selects the deployment; include_archived also searches "
                  "records older than one year, which is slower.")
    return tool(fn)

tools = [read_file] + [make(i) for i in range(1, 40)]
llm = ChatOpenAI(model="gpt-4.1", base_url=os.environ["BENCH_OPENAI_URL"], api_key="sk-bench-key", streaming=True, max_retries=6)
agent = create_react_agent(llm, tools, prompt="You are a careful assistant that reads files with read_file.")
out = agent.invoke({"messages": [("user", os.environ["BENCH_PROMPT"])]}, {"recursion_limit": 400})
print(out["messages"][-1].content)
'''

LLM_TOOLS = r'''
import os, time

def read_file(path: str) -> str:
    """Read a text file and return its whole content."""
    if os.environ.get("BENCH_SLOW") and path.endswith(os.environ["BENCH_SLOW"]):
        time.sleep(float(os.environ.get("BENCH_SLOW_SECONDS", "6")))
    with open(path, encoding="utf-8") as f:
        return f.read()
'''


@dataclass
class RunSpec:
    cmd: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    model: str = "gpt-4.1"


def client_spec(
    client: str, run: Path, task: Task, openai_url: str, anthropic_url: str, window: int
) -> RunSpec:
    """The command line, environment and files of one client run."""
    home = run / "home"
    home.mkdir(exist_ok=True)
    env = {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "BENCH_PROMPT": task.prompt,
        "BENCH_OPENAI_URL": openai_url,
    }
    bin_ = NPM / "node_modules" / ".bin"
    if client == "claude":
        env.update(ANTHROPIC_BASE_URL=anthropic_url, ANTHROPIC_API_KEY="sk-ant-bench-key")
        return RunSpec(
            [
                str(bin_ / "claude"),
                "-p",
                task.prompt,
                "--model",
                "claude-sonnet-4-5",
                "--allowedTools",
                "Read,Bash",
                "--output-format",
                "text",
            ],
            env,
            task.root,
            "claude-sonnet-4-5",
        )
    if client == "codex":
        codex_home = run / "codex-home"
        codex_home.mkdir(exist_ok=True)
        (codex_home / "config.toml").write_text(
            'model = "gpt-5-codex"\nmodel_provider = "bench"\napproval_policy = "never"\nsandbox_mode = "danger-full-access"\n'
            "check_for_update_on_startup = false\n"
            + (f"tool_output_token_limit = {CODEX_OUTPUT_TOKENS}\n" if CODEX_OUTPUT_TOKENS else "")
            + "\n[analytics]\nenabled = false\n\n[model_providers.bench]\n"
            f'name = "bench"\nbase_url = "{openai_url}"\nenv_key = "BENCH_API_KEY"\nwire_api = "responses"\n'
        )
        env.update(CODEX_HOME=str(codex_home), BENCH_API_KEY="sk-bench-key")
        return RunSpec(
            [str(bin_ / "codex"), "exec", "--skip-git-repo-check", task.prompt],
            env,
            task.root,
            "gpt-5-codex",
        )
    py = str(CACHE / f"venv-{VENV_OF[client]}" / "bin" / "python")
    if client.startswith("agents-"):
        (run / "agents_runner.py").write_text(AGENTS_RUNNER)
        return RunSpec([py, str(run / "agents_runner.py"), client.split("-", 1)[1]], env, task.root)
    if client == "langgraph":
        (run / "langgraph_runner.py").write_text(LANGGRAPH_RUNNER)
        return RunSpec([py, str(run / "langgraph_runner.py")], env, task.root)
    if client == "llm":
        user = run / "llm-home"
        user.mkdir(exist_ok=True)
        (user / "extra-openai-models.yaml").write_text(
            f'- model_id: bench-model\n  model_name: gpt-4.1\n  api_base: "{openai_url}"\n  api_key_name: bench\n  supports_tools: true\n'
        )
        (user / "keys.json").write_text(json.dumps({"bench": "sk-bench-key"}))
        (user / "logs-off").touch()
        (run / "llm_tools.py").write_text(LLM_TOOLS)
        env.update(LLM_USER_PATH=str(user))
        llm = str(CACHE / "venv-llm" / "bin" / "llm")
        return RunSpec(
            [
                llm,
                "prompt",
                "-m",
                "bench-model",
                "--functions",
                str(run / "llm_tools.py"),
                "--chain-limit",
                "0",
                "--td",
                "-n",
                task.prompt,
            ],
            env,
            task.root,
        )
    if client == "aider":
        aider = str(CACHE / "venv-aider" / "bin" / "aider")
        env.update(OPENAI_API_KEY="sk-bench-key", OPENAI_API_BASE=openai_url)
        # aider fetches litellm's model table from GitHub at start unless a fresh copy (< 24 h)
        # is in ~/.aider/caches: give it one naming the bench model and its window
        caches = home / ".aider" / "caches"
        caches.mkdir(parents=True, exist_ok=True)
        (caches / "model_prices_and_context_window.json").write_text(
            json.dumps(
                {
                    "gpt-4.1": {
                        "max_input_tokens": window,
                        "max_tokens": 32768,
                        "max_output_tokens": 32768,
                        "input_cost_per_token": 2e-06,
                        "output_cost_per_token": 8e-06,
                        "litellm_provider": "openai",
                        "mode": "chat",
                        "supports_function_calling": True,
                    },
                }
            )
        )
        for cmd in (
            ["git", "init", "-q"],
            ["git", "add", "."],
            ["git", "-c", "user.email=b@b", "-c", "user.name=b", "commit", "-qm", "task"],
        ):
            subprocess.run(cmd, cwd=task.root, check=False, capture_output=True)
        return RunSpec(
            [
                aider,
                "--model",
                "openai/gpt-4.1",
                "--openai-api-base",
                openai_url,
                "--openai-api-key",
                "sk-bench-key",
                "--yes-always",
                "--no-check-update",
                "--no-show-model-warnings",
                "--analytics-disable",
                "--no-auto-commits",
                "--no-dirty-commits",
                "--no-pretty",
                "--no-fancy-input",
                "--map-tokens",
                "0",
                "--edit-format",
                "whole",
                "--no-show-release-notes",
                "--no-detect-urls",
                "--message",
                task.prompt,
            ],
            env,
            task.root,
        )
    raise ValueError(f"unknown client {client}")


# --------------------------------------------------------------------------- one run


def run_client(
    client: str,
    window: int,
    steps: int,
    timeout: float,
    keep: Path | None,
    direct: bool,
    engine: str | None,
) -> dict[str, Any]:
    row: dict[str, Any] = {"client": client, "window": window, "status": ""}
    why = installed(client)
    if why:
        row["status"] = why
        return row
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-{client}-{window}-"))
    try:
        return _run(client, window, steps, timeout, tmp, row, direct, engine)
    except Exception as exc:  # one client's crash is a row, not the end of the run
        row["status"] = f"bench error: {type(exc).__name__}: {exc}"[:300]
        return row
    finally:
        if keep is not None:
            dest = keep / f"{client}-{window}"
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(
                tmp, dest, ignore=shutil.ignore_patterns("node_modules", ".git"), dirs_exist_ok=True
            )
        shutil.rmtree(tmp, ignore_errors=True)


def _run(
    client: str,
    window: int,
    steps: int,
    timeout: float,
    tmp: Path,
    row: dict[str, Any],
    direct: bool,
    engine: str | None,
) -> dict[str, Any]:
    prompt = ""
    if client == "aider":
        steps = min(steps, 3)  # aider follows at most 3 "add this file" reflections per message
        # no file names in the prompt: aider adds every file a user message names at once
        prompt = f"BENCH-TASK: read the {steps} numbered part files of this repository one at a time, in order, and report the line 'MARKER partNN = CODE' of each."
    task = Task(tmp / "ws", steps=steps, prompt=prompt, reread=(steps - 2, 2) if REREAD and steps > 4 else None)
    task.write()
    restart = Restarter(max(2, steps // 2), pause=client in PAUSED_CLIENTS and not direct)
    upstream = StrictUpstream(
        task,
        window=window,
        log_path=tmp / "upstream.jsonl",
        on_step=restart.on_step,
        slow_step=restart.at if not direct else None,
        slow_seconds=SLOW_SECONDS,
    )
    upstream.start()
    proxy: Proxy | None = None
    rc: int | None = None
    try:
        if direct:
            openai_url, anthropic_url = upstream.openai_base_url, upstream.anthropic_base_url
        else:
            proxy = Proxy(tmp, upstream, window, engine)
            proxy.start()
            openai_url, anthropic_url = proxy.openai_url, proxy.anthropic_url
        spec = client_spec(client, tmp, task, openai_url, anthropic_url, window)
        rc = _run_client(spec, task, restart, proxy, tmp, row, timeout)
    finally:
        if proxy is not None:
            proxy.stop()
        upstream.stop()
    return _summarise(row, rc, tmp, upstream, proxy, restart.restarted_at, timeout)


def _run_client(
    spec: RunSpec,
    task: Task,
    restart: Restarter,
    proxy: Proxy | None,
    tmp: Path,
    row: dict[str, Any],
    timeout: float,
) -> int | None:
    """Run the client to its end or the timeout (None), the proxy restarted on the way."""
    env = {k: v for k, v in os.environ.items() if k not in DROP_ENV and not k.startswith("PYTHON")}
    env.update(QUIET_ENV)
    env.update(spec.env)
    env["BENCH_SLOW"] = task.name(restart.at)
    env["BENCH_SLOW_SECONDS"] = str(SLOW_SECONDS)
    with open(tmp / "client.out", "wb") as out:
        started = time.monotonic()
        proc = subprocess.Popen(
            spec.cmd,
            cwd=spec.cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        t = restart.watch(proc, proxy, row)
        try:
            rc: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            rc = None
    row["seconds"] = round(time.monotonic() - started, 1)
    t.join(timeout=30)
    return rc


class Restarter:
    """The proxy's restart half way through a run: once the upstream has answered the request
    that asks for file ``at``, the proxy is stopped and started again on the same port and store.

    A client with a tool the bench can slow down (a ``sleep`` in its shell command, or the
    bench's own read_file) runs that step's tool for :data:`SLOW_SECONDS` meanwhile. A client
    without one (``pause``: aider sends no tools and answers a reply within a fraction of a
    second) is paused (SIGSTOP of its process group) from the moment the upstream has sent that
    answer until the proxy is up again (SIGCONT): its next request meets the new process
    whatever the machine's speed, instead of racing the restart."""

    def __init__(self, at: int, *, pause: bool = False) -> None:
        self.at = at
        self.pause = pause
        self.due = threading.Event()
        self.restarted_at: list[float] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False

    def on_step(self, step: int) -> None:
        """The upstream's ``on_step`` (its thread, right after the answer was sent)."""
        if step != self.at or self.due.is_set():
            return
        if self.pause and self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGSTOP)
                self.paused = True
        self.due.set()

    def watch(
        self, proc: subprocess.Popen[bytes], proxy: Proxy | None, row: dict[str, Any]
    ) -> threading.Thread:
        """A thread that restarts ``proxy`` when the step is due, while ``proc`` runs."""
        self.proc = proc

        def run() -> None:
            try:
                while proxy is not None and proc.poll() is None:
                    if self.due.wait(0.2):
                        time.sleep(1.0)  # the proxy relays the end of the stream, writes the turn
                        self.restarted_at.append(time.time())
                        proxy.restart()
                        row["restart_seconds"] = round(time.time() - self.restarted_at[0], 1)
                        return
            finally:
                self.resume()

        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t

    def resume(self) -> None:
        """Let a paused client go on (SIGCONT)."""
        if self.paused and self.proc is not None:
            self.paused = False
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGCONT)


def _summarise(
    row: dict[str, Any],
    rc: int | None,
    tmp: Path,
    upstream: StrictUpstream,
    proxy: Proxy | None,
    restarted_at: list[float],
    timeout: float,
) -> dict[str, Any]:
    st = upstream.stats
    tail = (tmp / "client.out").read_text(errors="replace")[-600:].strip().replace("\n", " | ")
    row["rc"] = rc
    row["done"] = bool(st["finished"])
    row["steps"] = len(st["steps_seen"])
    row["reqs"] = st["chat_requests"]
    row["bad"] = sum(st["rejected"].values())
    row["rejected"] = dict(st["rejected"])
    row["upstream_tokens"] = st["input_tokens"]
    row["max_request_tokens"] = st["max_tokens_seen"]
    row["recall"] = f"{st['recall_answered']}/{st['recall_calls']}"
    row["client_compactions"] = st["client_compactions"]
    if st["reread"] is not None:
        # the re-read scenario: what the client answered, and whether the file was in view after it
        row["reread"] = "in view" if st["reread"]["in_view"] else "gone"
        row["reread_answer"] = st["reread"]["answer"]
    row["paths"] = dict(st["paths"])
    if rc is None:
        row["status"] = f"timeout after {timeout:.0f} s"
    elif rc != 0:
        row["status"] = f"exit {rc}: {tail[-300:]}"
    else:
        row["status"] = "ok" if row["done"] else f"exit 0 but unfinished: {tail[-200:]}"
    if proxy is None:
        row["kept"] = "-"
        return row
    reqs = proxy.requests()
    task_reqs = [(life, r) for life, r in reqs if r.get("tokens_in", 0) > 0]
    row["compact"] = sum(int(r.get("compactions") or 0) for _l, r in task_reqs)
    # turns the proxy planned on its event loop (a turn that only appends: no compaction, no cut)
    planned = [str(r.get("planned")) for _l, r in task_reqs if r.get("planned")]
    row["inline"] = round(planned.count("inline") / len(planned), 2) if planned else None
    row["worker_reasons"] = {k: planned.count(k) for k in sorted(set(planned)) if k != "inline"}
    # the proxy logs its own estimate of each conversation in and out (without the tool
    # definitions); what the client sent is what reached the upstream (exact) plus what the
    # proxy removed
    row["proxy_in_tokens"] = sum(int(r.get("tokens_in") or 0) for _l, r in task_reqs)
    row["proxy_out_tokens"] = sum(int(r.get("tokens_out") or 0) for _l, r in task_reqs)
    removed = row["proxy_in_tokens"] - row["proxy_out_tokens"]
    row["sent_tokens"] = row["upstream_tokens"] + removed
    row["saved"] = round(removed / row["sent_tokens"], 3) if row["sent_tokens"] else None
    _fixed_share(row, tmp / "upstream.jsonl", removed)
    row["proxy_outcomes"] = {}
    for _l, r in reqs:
        key = f"{r.get('api')}:{r.get('outcome')}"
        row["proxy_outcomes"][key] = row["proxy_outcomes"].get(key, 0) + 1
    row["proxy_problems"] = proxy.problems()[:20]
    row["proxy_lives"] = proxy.lives
    if proxy.restart_error:
        row["kept"] = f"restart failed: {proxy.restart_error}"[:200]
    elif not restarted_at:
        row["kept"] = "no restart (step not reached)"
    else:
        before = [r for life, r in task_reqs if life == 1]
        after = [r for life, r in task_reqs if life >= 2]
        if not after:
            row["kept"] = "no request after restart"
        elif not before:
            row["kept"] = "no request before restart"
        else:
            same = after[0].get("session") == before[-1].get("session")
            grown = int(after[0].get("tokens_out") or 0) - int(before[-1].get("tokens_out") or 0)
            limit = 2 * upstream.task.file_tokens + 2000
            row["kept"] = (
                "yes"
                if same and grown <= limit
                else ("new session" if not same else f"rebuilt (+{grown} tokens)")
            )
    return row


# --------------------------------------------------------------------------- the fixed part

RECORD = "[ctxengine:"  # the proxy's own records (digests, summaries, cut outputs) start so


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text") or "") for p in content if isinstance(p, dict) and "text" in p
        )
    return ""


def _fixed_item(api: str, m: Any) -> bool:
    """Whether one message or input item is one no compaction may change: a system or developer
    prompt, or a user message (engines keep every user message verbatim); not a tool result,
    not the model's turn, not one of the proxy's records."""
    if not isinstance(m, dict) or _text(m.get("content")).startswith(RECORD):
        return False
    role = m.get("role")
    if api == "responses" and m.get("type") not in (None, "message"):
        return False
    if role in ("system", "developer"):
        return True
    if role != "user":
        return False
    content = m.get("content")
    return not (
        isinstance(content, list)
        and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)
    )


def _is_output(api: str, m: Any) -> bool:
    if not isinstance(m, dict):
        return False
    if api == "responses":
        return str(m.get("type", "")).endswith("_output")
    if api == "messages":
        content = m.get("content")
        return isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") == "tool_result" for b in content
        )
    return m.get("role") == "tool"


def request_parts(path: str, body: dict[str, Any]) -> dict[str, int]:
    """One request as the strict upstream counts it (o200k), split: ``fixed`` the part no
    compaction may change (the tool definitions, the system prompt or instructions, the system,
    developer and user messages: a client resends it whole every turn), ``whole`` and ``cut``
    the tool outputs sent whole and the ones the proxy cut or folded (counts)."""
    api = (
        "responses"
        if path.rstrip("/").endswith("/responses")
        else ("messages" if "/messages" in path else "chat")
    )
    key = "input" if api == "responses" else "messages"
    items = body.get(key)
    items = [{"role": "user", "content": items}] if isinstance(items, str) else list(items or [])
    kept = {k: body[k] for k in ("system", "instructions", "tools") if body.get(k)}
    kept[key] = [m for m in items if _fixed_item(api, m)]
    outputs = [m for m in items if _is_output(api, m)]
    cut = sum(1 for m in outputs if RECORD in json.dumps(m, ensure_ascii=False))
    return {
        "tokens": count_request_tokens(body),
        "fixed": count_request_tokens(kept),
        "whole": len(outputs) - cut,
        "cut": cut,
    }


def task_requests(log: Path) -> list[dict[str, int]]:
    """:func:`request_parts` of every task request the upstream answered (its log), in order."""
    out: list[dict[str, int]] = []
    if not log.exists():
        return out
    for line in log.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            body = rec.get("body") if isinstance(rec, dict) else None
            if rec.get("status") != 200 or not isinstance(body, dict):
                continue
            if "BENCH-TASK" in json.dumps(body.get("messages") or body.get("input") or ""):
                out.append(request_parts(str(rec.get("path", "")), body))
    return out


def _fixed_share(row: dict[str, Any], log: Path, removed: int) -> None:
    """``fixed``: the share of what the client sent that no compaction may change (its tool
    definitions, system/developer prompts and user messages, resent every turn); ``saved_rest``:
    the share of the rest that the proxy removed; ``per_request``: each request's parts."""
    parts = task_requests(log)
    row["per_request"] = parts
    fixed = sum(p["fixed"] for p in parts)
    row["fixed_tokens"] = fixed
    sent = int(row.get("sent_tokens") or 0)
    row["fixed"] = round(fixed / sent, 3) if sent else None
    row["saved_rest"] = round(removed / (sent - fixed), 3) if sent > fixed else None


# --------------------------------------------------------------------------- report


def table(rows: list[dict[str, Any]]) -> str:
    head = [
        "client",
        "window",
        "done",
        "steps",
        "reqs",
        "bad",
        "compact",
        "inline",
        "sent",
        "upstream",
        "saved",
        "fixed",
        "rest",
        "recall",
        "kept",
        "reread",
        "secs",
        "status",
    ]
    lines = [head]
    for r in rows:
        saved = r.get("saved")
        lines.append(
            [
                str(r["client"]),
                str(r["window"]),
                "yes" if r.get("done") else "no",
                str(r.get("steps", "-")),
                str(r.get("reqs", "-")),
                str(r.get("bad", "-")) + (f" {_short(r['rejected'])}" if r.get("rejected") else ""),
                str(r.get("compact", "-")),
                f"{r['inline']:.0%}" if isinstance(r.get("inline"), float) else "-",
                str(r.get("sent_tokens", "-")),
                str(r.get("upstream_tokens", "-")),
                f"{saved:.0%}" if isinstance(saved, float) else "-",
                _pct(r.get("fixed")),
                _pct(r.get("saved_rest")),
                str(r.get("recall", "-")),
                str(r.get("kept", "-"))
                + (
                    f" ({r['restart_seconds']}s)"
                    if r.get("kept") == "yes" and "restart_seconds" in r
                    else ""
                ),
                str(r.get("reread", "-")),
                str(r.get("seconds", "-")),
                str(r.get("status", ""))[:70],
            ]
        )
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    out = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in lines
    ]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def _pct(value: Any) -> str:
    return f"{value:.0%}" if isinstance(value, float) else "-"


def _short(rejected: dict[str, int]) -> str:
    return "(" + ",".join(f"{k}:{v}" for k, v in rejected.items()) + ")"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--install", action="store_true", help="install the clients into .bench-clients/ and exit"
    )
    p.add_argument(
        "--clients",
        default=",".join(ALL_CLIENTS),
        help=f"comma-separated, of {','.join(ALL_CLIENTS)}",
    )
    p.add_argument("--window", default="16000,40000", help="comma-separated context windows")
    p.add_argument("--steps", type=int, default=16, help="files to read (10-40)")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds per client run")
    p.add_argument("--engine", help="the proxy's --engine")
    p.add_argument(
        "--mode",
        choices=["summary", "digest", "auto"],
        help="the proxy's compression.mode (default: the proxy's own default)",
    )
    p.add_argument(
        "--direct",
        action="store_true",
        help="no proxy: the clients talk to the strict upstream (recording)",
    )
    p.add_argument(
        "--keep",
        type=Path,
        help="copy each run's folder (upstream.jsonl, proxy.log, client.out) here",
    )
    p.add_argument("--json", type=Path, help="write the rows here")
    p.add_argument(
        "--proxy-src",
        type=Path,
        help="the src/ folder whose ctxengine the proxy runs (default: this checkout's)",
    )
    p.add_argument(
        "--proxy-config",
        type=Path,
        help="a YAML file of top-level sections appended to the proxy's config (e.g. compression: {mode: digest})",
    )
    p.add_argument(
        "--codex-output-tokens",
        type=int,
        default=None,
        metavar="N",
        help="Codex's tool_output_token_limit (its own default cuts a command's output near 10 KB, ~2.5K tokens of the "
        "task's ~4K-token files; 5000 gives Codex the whole files the other clients read)",
    )
    p.add_argument(
        "--reread",
        action="store_true",
        help="the re-read scenario: two files before the end the task asks for part02.txt again (Claude Code answers "
        "'unchanged since your last Read'); column reread: whether part02's content was in the next request",
    )
    p.add_argument(
        "--proxy-debug",
        action="store_true",
        help="the proxy logs at debug level (each compaction's notes) into proxy.log",
    )
    a = p.parse_args(argv)
    clients = [c.strip() for c in a.clients.split(",") if c.strip()]
    unknown = [c for c in clients if c not in ALL_CLIENTS]
    if unknown:
        p.error(f"unknown clients {unknown}; known: {ALL_CLIENTS}")
    if a.install:
        for c, s in install(clients).items():
            print(f"{c}: {s}")
        return 0
    global PROXY_SRC, PROXY_DEBUG, PROXY_MODE, PROXY_CONFIG, CODEX_OUTPUT_TOKENS, REREAD
    CODEX_OUTPUT_TOKENS = a.codex_output_tokens
    REREAD = a.reread
    if a.proxy_config:
        PROXY_CONFIG = a.proxy_config.read_text()
    if a.proxy_src:
        PROXY_SRC = a.proxy_src.resolve()
    PROXY_DEBUG = a.proxy_debug
    PROXY_MODE = a.mode
    windows = [int(w) for w in a.window.split(",") if w.strip()]
    if a.keep:
        a.keep.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for client in clients:
        for window in windows:
            print(
                f"[{time.strftime('%H:%M:%S')}] {client} window={window} …",
                file=sys.stderr,
                flush=True,
            )
            row = run_client(client, window, a.steps, a.timeout, a.keep, a.direct, a.engine)
            print(f"    {row.get('status')}", file=sys.stderr, flush=True)
            rows.append(row)
            if a.json:
                a.json.write_text(json.dumps(rows, indent=1, default=str))
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
