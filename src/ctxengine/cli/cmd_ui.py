"""``ctxengine ui``: the dashboard over a session store, served alone (``ctxengine proxy`` serves
the same pages at ``/ui``)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import click

from ctxengine.config import load_config
from ctxengine.store import SessionStore, SqliteStore, open_store

__all__ = ["COMMANDS", "ui"]


@click.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=None, help="config.yaml (its store: section names the store to read).")
@click.option("--store", "store_path", type=click.Path(dir_okay=False), default=None, help="SQLite store file (default: store: in the config).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind. Beyond loopback a token is required.")
@click.option("--port", type=click.IntRange(0, 65535), default=8788, show_default=True)
@click.option("--auth-token", default=None, help="Token the pages require (default: $CTXENGINE_PROXY_TOKEN, see proxy.auth_token_env).")
def ui(config_path: Path | None, store_path: str | None, host: str, port: int, auth_token: str | None) -> None:
    """Serve the dashboard (savings, sessions, each compaction's audit) over a session store.

    Open http://127.0.0.1:8788/ui/. Needs: pip install 'ctxengine[proxy]'.
    """
    try:
        import uvicorn

        from ctxengine.proxy import check_bind
        from ctxengine.ui.app import Dashboard
    except ImportError as exc:
        raise click.ClickException(f"the dashboard needs the proxy extra: pip install 'ctxengine[proxy]' ({exc})") from exc
    config = load_config(config_path)
    token = auth_token or os.environ.get(config.proxy.auth_token_env) or None
    check_bind(host, token, config.proxy.auth_token_env)
    store: SessionStore = SqliteStore(store_path) if store_path else open_store(config.store)
    click.echo(f"ctxengine dashboard on http://{host}:{port}/ui/ (store {store.backend})", err=True)
    dashboard = Dashboard(store, auth_token=token)
    threading.Thread(target=dashboard.warm, name="ctxengine-ui-warm", daemon=True).start()  # the log added up once
    try:
        uvicorn.run(dashboard.app, host=host, port=port, log_config=None, access_log=False)
    finally:
        store.close()


COMMANDS = [ui]
