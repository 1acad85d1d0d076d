"""The session store: every original message kept, compactions recorded as events.

``open_store(config.store)`` returns the configured backend: SQLite (the embedded default, one
file under the user data directory) or PostgreSQL (DSN read from the environment variable named
by ``store.dsn_env``, never from the config file). See :mod:`ctxengine.store.base` for the data
model and the interface.

This package knows messages, never engines (the ``lcm`` engine receives a store object).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Protocol

from ctxengine.errors import ConfigError
from ctxengine.store.base import (
    EXPORT_FORMAT,
    CompactionInfo,
    Event,
    NodeInfo,
    RequestRecord,
    SearchHit,
    SessionInfo,
    SessionStore,
    SqlStore,
    UsageRow,
)
from ctxengine.store.sqlite import SqliteStore, default_path

__all__ = [
    "EXPORT_FORMAT",
    "CompactionInfo",
    "Event",
    "NodeInfo",
    "RequestRecord",
    "SearchHit",
    "SessionInfo",
    "SessionStore",
    "SqlStore",
    "SqliteStore",
    "StoreSettings",
    "UsageRow",
    "default_path",
    "open_store",
]


class StoreSettings(Protocol):
    """What :func:`open_store` reads: the fields of :class:`ctxengine.config.StoreConfig`.

    (A protocol, because the store sits below the config layer and never imports it.)
    """

    @property
    def backend(self) -> str: ...

    @property
    def path(self) -> str | None: ...

    @property
    def dsn_env(self) -> str: ...


def open_store(config: StoreSettings | None = None, *, environ: Mapping[str, str] | None = None) -> SessionStore:
    """Open the store ``config`` describes (``None``: SQLite at the default path).

    PostgreSQL takes its DSN from the environment variable ``config.dsn_env`` (default
    ``CTXENGINE_STORE_DSN``) so that passwords stay out of config files. A ``redact_content``
    setting (from ``redaction.content``) makes the store redact key shapes from messages.
    """
    if config is None:
        return SqliteStore()
    store = _open(config, environ)
    store.redact_content = bool(getattr(config, "redact_content", False))
    return store


def _open(config: StoreSettings, environ: Mapping[str, str] | None) -> SqlStore:
    backend = config.backend
    if backend == "sqlite":
        return SqliteStore(config.path)
    if backend == "postgres":
        env = os.environ if environ is None else environ
        dsn = env.get(config.dsn_env)
        if not dsn:
            raise ConfigError(f"store.backend is postgres but the environment variable {config.dsn_env} (store.dsn_env) holding the DSN is not set")
        from ctxengine.store.postgres import PostgresStore

        return PostgresStore(dsn)
    raise ConfigError(f"unknown store backend {backend!r}; use sqlite or postgres")
