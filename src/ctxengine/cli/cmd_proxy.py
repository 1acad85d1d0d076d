"""``ctxengine proxy``: serve the OpenAI- and Anthropic-compatible context-managing proxy."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import click

from ctxengine.config import load_config


def _model_windows(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, int]:
    """``--model-window MODEL=TOKENS`` (repeatable) as ``{MODEL: TOKENS}``; a bad value names the flag."""
    out: dict[str, int] = {}
    for value in values:
        model, sep, tokens = value.rpartition("=")
        model = model.strip()
        if not sep or not model:
            raise click.BadParameter(f"{value!r} is not MODEL=TOKENS (e.g. --model-window gpt-4o=128000 or 'qwen*=32768')", ctx=ctx, param=param)
        try:
            n = int(tokens.strip().replace("_", "").replace(",", ""))
        except ValueError:
            raise click.BadParameter(f"{value!r}: {tokens!r} is not a number of tokens", ctx=ctx, param=param) from None
        if n <= 0:
            raise click.BadParameter(f"{value!r}: the window must be a positive number of tokens", ctx=ctx, param=param)
        out[model] = n
    return out


@click.command()
@click.option("--host", default=None, help="Address to bind (config proxy.host; default 127.0.0.1). Beyond loopback a token is required.")
@click.option("--port", type=click.IntRange(0, 65535), default=None, help="Port (config proxy.port; default 8787).")
@click.option("--openai-base-url", default=None, help="Upstream for OpenAI-style requests, ending in /v1 (default https://api.openai.com/v1).")
@click.option("--anthropic-base-url", default=None, help="Upstream for Anthropic-style requests (default https://api.anthropic.com).")
@click.option("--gemini-base-url", default=None, help="Upstream for Gemini API requests (/v1beta/models/…; default https://generativelanguage.googleapis.com).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=None, help="config.yaml (its proxy: section holds the same keys as these flags).")
@click.option("--auth-token", default=None, help="Token clients must send in x-ctxengine-token (default: $CTXENGINE_PROXY_TOKEN, see proxy.auth_token_env).")
@click.option("--engine", default=None, help="Context engine for every session (config context.engine).")
@click.option("--no-recall-tools", is_flag=True, default=False, help="Never add the engine's recall tools to requests.")
@click.option(
    "--context-length",
    type=click.IntRange(min=1),
    default=None,
    metavar="TOKENS",
    help="Window assumed for a model that is not in the model table and has no --model-window (config model.default_context_length; default 128000).",
)
@click.option(
    "--model-window",
    "model_windows",
    multiple=True,
    callback=_model_windows,
    metavar="MODEL=TOKENS",
    help="Window of one model, or of every model a glob matches ('qwen*=32768', '*=16384'); repeatable (config models.<name>.context_length). "
    "Otherwise: the model table, or a window learnt from the provider's rejection.",
)
@click.option("--shadow", is_flag=True, default=False, help="Forward every request unchanged and record what ctxengine would have sent (config proxy.shadow): the dashboard shows the savings before you switch.")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Processes serving the port (config proxy.workers; default 1); they share sessions through the store.")
@click.option("--log-format", type=click.Choice(["json", "text"]), default="json", show_default=True, help="Log lines as JSON objects or as text.")
def proxy(
    host: str | None,
    port: int | None,
    openai_base_url: str | None,
    anthropic_base_url: str | None,
    gemini_base_url: str | None,
    config_path: Path | None,
    auth_token: str | None,
    engine: str | None,
    no_recall_tools: bool,
    context_length: int | None,
    model_windows: dict[str, int],
    shadow: bool,
    workers: int | None,
    log_format: str,
) -> None:
    """Serve an OpenAI- and Anthropic-compatible proxy that manages each session's context.

    Point an agent at it: OPENAI_BASE_URL=http://127.0.0.1:8787/v1 or
    ANTHROPIC_BASE_URL=http://127.0.0.1:8787 or GOOGLE_GEMINI_BASE_URL=http://127.0.0.1:8787. Needs: pip install 'ctxengine[proxy]'.
    """
    try:
        from ctxengine.proxy import check_bind, serve
        from ctxengine.proxy.logs import JsonFormatter, TextFormatter
    except ImportError as exc:
        raise click.ClickException(f"the proxy needs its extra: pip install 'ctxengine[proxy]' ({exc})") from exc
    config = load_config(config_path)
    overrides: dict[str, Any] = {
        k: v
        for k, v in {"host": host, "port": port, "openai_base_url": openai_base_url, "anthropic_base_url": anthropic_base_url, "gemini_base_url": gemini_base_url, "workers": workers}.items()
        if v is not None
    }
    if no_recall_tools:
        overrides["recall_tools"] = False
    if shadow:
        overrides["shadow"] = True
    sections: dict[str, Any] = {"proxy": overrides}
    if engine:
        sections["context"] = {"engine": engine}
    if context_length is not None:
        sections["model"] = {"default_context_length": context_length}
    if model_windows:
        sections["models"] = {name: {"context_length": n} for name, n in model_windows.items()}
    config = config.with_overrides(**sections)
    settings = config.proxy
    token = auth_token or os.environ.get(settings.auth_token_env) or None
    check_bind(settings.host, token, settings.auth_token_env)  # refused before logging is set up
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger("ctxengine")
    root.handlers[:] = [handler]
    root.setLevel(min(logging.getLogger().level or logging.INFO, logging.INFO))
    root.propagate = False
    mode = ", shadow mode: requests go upstream unchanged" if settings.shadow else ""
    many = f", {settings.workers} workers" if settings.workers > 1 else ""
    click.echo(f"ctxengine proxy on http://{settings.host}:{settings.port} (engine {config.context.engine}, store {config.store.backend}{many}{mode}); dashboard at /ui/", err=True)
    serve(config, auth_token=token)


COMMANDS = [proxy]
