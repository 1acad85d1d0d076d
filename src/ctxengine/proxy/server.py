"""Running the proxy: :func:`serve` (the ``ctxengine proxy`` command, blocking) and
:class:`ProxyServer` (a background thread on 127.0.0.1, for tests and benchmarks).

Binding beyond loopback requires a proxy token (:func:`check_bind`): an open proxy on a network
interface would let anyone spend the keys its clients send, or read its sessions.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import threading
import time
from typing import Any, Literal

import uvicorn

from ctxengine.config import Config
from ctxengine.errors import ConfigError
from ctxengine.proxy.app import Proxy
from ctxengine.storage import SessionRecorder

__all__ = ["ProxyServer", "check_bind", "is_loopback", "serve"]


def is_loopback(host: str) -> bool:
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, auth_token: str | None, env_name: str) -> None:
    """Refuse a non-loopback ``host`` without a token (:class:`ConfigError` naming the fix)."""
    if not is_loopback(host) and not auth_token:
        raise ConfigError(
            f"binding the proxy to {host} (beyond loopback) requires a proxy token: pass --auth-token "
            f"or set {env_name}; clients then send it in the x-ctxengine-token header"
        )


def _uvicorn_config(proxy: Proxy, host: str, port: int, **kwargs: Any) -> uvicorn.Config:
    return uvicorn.Config(
        proxy.app, host=host, port=port, log_config=None, access_log=False, lifespan="on", timeout_graceful_shutdown=5, **kwargs
    )


def serve(config: Config, *, auth_token: str | None = None) -> None:
    """Serve until interrupted (the CLI's entry point); ``proxy.workers`` processes on one port."""
    settings = config.proxy
    token = auth_token or os.environ.get(settings.auth_token_env) or None
    check_bind(settings.host, token, settings.auth_token_env)
    if settings.workers > 1:
        _serve_workers(config, token, settings.workers)
        return
    proxy = Proxy(config, auth_token=token, freeze_gc=True)  # a process of its own: see Proxy
    uvicorn.Server(_uvicorn_config(proxy, settings.host, settings.port)).run()


def check_workers(config: Config) -> None:
    """Several workers share sessions through the store (:mod:`ctxengine.proxy.turns`): one must
    be configured, on a file or a database every worker opens."""
    store = config.store
    if not store.enabled or (store.backend == "sqlite" and store.path == ":memory:"):
        raise ConfigError(
            f"proxy.workers is {config.proxy.workers}, but the workers share each session through the session store, and "
            "none is configured (store.enabled: false or an in-memory SQLite): set store.path to a file (or use PostgreSQL), or run one worker"
        )


def _serve_workers(config: Config, token: str | None, workers: int) -> None:
    """``workers`` processes forked after the listening socket is bound: the kernel hands each
    connection to one of them; each has its own proxy (store connections, threads, event loop).
    A session's turns may land on any worker: its turn lock and version keep it one session.
    SIGTERM or SIGINT stops them all; a worker that dies stops the others too."""
    check_workers(config)
    settings = config.proxy
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((settings.host, settings.port))
    sock.listen(2048)
    sock.set_inheritable(True)
    children: list[int] = []
    for _ in range(workers):
        pid = os.fork()
        if pid == 0:  # a worker: its own proxy, served on the shared socket
            code = 0
            try:
                proxy = Proxy(config, auth_token=token, freeze_gc=True)
                uvicorn.Server(_uvicorn_config(proxy, settings.host, settings.port)).run(sockets=[sock])
            except BaseException:
                code = 1
            os._exit(code)
        children.append(pid)
    sock.close()

    def stop(signum: int, frame: object) -> None:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    live = set(children)
    while live:
        try:
            pid, _ = os.wait()
        except ChildProcessError:
            break
        live.discard(pid)
        stop(signal.SIGTERM, None)


class ProxyServer:
    """A proxy on 127.0.0.1 (a free port unless ``port`` is given) served from a background
    thread: ``with ProxyServer(config) as p: openai.OpenAI(base_url=p.openai_base_url)``."""

    def __init__(
        self,
        config: Config | None = None,
        *,
        port: int = 0,
        auth_token: str | None = None,
        store: SessionRecorder | Literal["default"] | None = "default",
    ) -> None:
        self.proxy = Proxy(config, auth_token=auth_token, store=store)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", port))
        self.port = int(self._sock.getsockname()[1])
        self._server = uvicorn.Server(_uvicorn_config(self.proxy, "127.0.0.1", self.port))
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_base_url(self) -> str:
        return self.url + "/v1"

    @property
    def anthropic_base_url(self) -> str:
        return self.url

    @property
    def gemini_base_url(self) -> str:
        """What Gemini CLI takes as ``GOOGLE_GEMINI_BASE_URL`` (it appends ``/v1beta/models/…``)."""
        return self.url

    def start(self) -> ProxyServer:
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, name="ctxengine-proxy", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the proxy server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._thread = None
        self._sock.close()

    def __enter__(self) -> ProxyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
