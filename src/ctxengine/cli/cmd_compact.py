"""``ctxengine compact``, ``ctxengine count`` and ``ctxengine engines``.

``compact`` runs one engine over saved sessions, as a manual ``/compress`` does (it always
compacts, whatever the trigger says), through the library's own turn
(:meth:`ctxengine.ContextManager.prepare` with ``compact=True``: the one agent loop's isolated
call, ``context.engine_timeout``, the output guard, the window cap). Each session is recorded in
the configured store under its id before anything is cut, as the library records a turn, with
the compaction and any window cut as events: ``ctxengine sessions search`` / ``export
--originals`` give back verbatim what the output no longer holds (its markers say the originals
are kept in the session store; ``store.enabled: false`` records nothing). The input is
validated first, like the library's ``prepare`` does: an invalid message (orphan tool result,
duplicate ids, ``content: 42``, a missing role, NaN…) is the input's fault and is reported with
the file, the session and the index (exit 2), before any engine runs. The result must be a
valid chat too (an invalid one is the engine's fault and is reported as
:class:`~ctxengine.errors.EngineError` naming the broken rule). The result is written in the shape it came in: a JSON list stays a list, an object keeps its
other keys (``id``, ``tools``, ``meta``…), JSON Lines stay JSON Lines. The before/after table
goes to stderr so stdout can be piped.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from ctxengine.config import Config, load_config
from ctxengine.errors import ConfigError, EngineError, InputError, TokenizerError
from ctxengine.io import Document, Session, read_document
from ctxengine.manager import ContextManager, default_store
from ctxengine.messages import Message, check
from ctxengine.models import resolve_model
from ctxengine.registry import EngineRegistry
from ctxengine.storage import SessionRecorder
from ctxengine.textsafe import clean, dumps
from ctxengine.tokens import ExactCounter, estimate_messages_tokens, get_counter

PROGRESS_MIN_SESSIONS = 5
"""Files with at least this many sessions get a progress bar on stderr."""


def _load(path: str) -> Document:
    return read_document(path)


def _validate_input(inp: Document, source: str) -> None:
    """Every session must be a valid chat before an engine sees it (exit 2 naming the file,
    the session and each bad message's index)."""
    for session in inp.sessions:
        check(session.messages, context=f"input: {source}, session {clean(session.id)!r}", allow_pending_calls=True)


def _with_messages(raw: Any, messages: list[Message]) -> Any:
    if isinstance(raw, dict):
        return {**raw, "messages": messages}
    return messages


def _dump(inp: Document, outputs: Sequence[list[Message]]) -> str:
    # textsafe.dumps: a lone surrogate in a message is written as a \uXXXX escape (exact, encodable)
    if inp.shape == "jsonl":
        lines = [dumps(_with_messages(r, m)) for r, m in zip(inp.raw, outputs, strict=True)]
        return "\n".join(lines) + "\n"
    return dumps(_with_messages(inp.raw[0], outputs[0]), indent=2) + "\n"


def _context_length(config: Config, context_length: int | None, model: str | None) -> int | None:
    """--context-length, else the model's profile (--model, then ``model.default``), else
    None (the registry falls back to ``model.context_length`` / the default)."""
    if context_length is not None:
        if context_length <= 0:
            raise ConfigError(f"--context-length must be a positive number of tokens, got {context_length}")
        return context_length
    name = model or config.model.default
    if name:
        profile = resolve_model(
            name,
            overrides=config.models,
            default_context_length=config.model.default_context_length,
            context_length=config.model.context_length,
        )
        return profile.context_length
    return None


@contextmanager
def _progress(items: Sequence[Session], label: str) -> Iterator[Any]:
    if len(items) >= PROGRESS_MIN_SESSIONS:
        with click.progressbar(items, label=label, file=sys.stderr) as bar:
            yield bar
    else:
        yield items


def _table(rows: list[list[str]], align: str) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [c.ljust(w) if a == "<" else c.rjust(w) for c, w, a in zip(r, widths, align, strict=True)]
        out.append("  ".join(cells).rstrip())
    return out


def _store_for(config: Config) -> SessionRecorder | None:
    """The configured store, opened by the function the library opens it with
    (:func:`ctxengine.manager.default_store`), so the CLI accepts exactly the configurations
    :meth:`ContextManager.from_config` accepts: a store path that is a directory, a file that is
    not a database, a PostgreSQL DSN that is not set are the same error here (exit 2) as there.
    ``None`` when the store is disabled."""
    return default_store(config)


def _close(store: object) -> None:
    close = getattr(store, "close", None)
    if callable(close):
        close()


@click.command()
@click.argument("file", metavar="FILE|-")
@click.option("--engine", "engine_name", metavar="NAME", help="Engine to run (default: context.engine from the config).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="config.yaml to use.")
@click.option("--context-length", type=int, metavar="N", help="Context window in tokens (default: the model's).")
@click.option("--model", metavar="NAME", help="Model whose context window to use (e.g. anthropic/claude-sonnet-4.5).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), help="Write here instead of stdout.")
def compact(file: str, engine_name: str | None, config_path: str | None, context_length: int | None, model: str | None, output: str | None) -> None:
    """Compact the session(s) in FILE (JSON list of messages, {"messages": [...]}, or JSONL)."""
    config = load_config(config_path)
    n = _context_length(config, context_length, model)
    counter = get_counter(config.context.token_counter)
    inp = _load(file)
    _validate_input(inp, "<stdin>" if file == "-" else file)
    name = engine_name or config.context.engine
    store = _store_for(config)  # checked for every engine, used by the lossless one
    try:
        outputs, rows = _compact_all(config, inp, name, n, counter, store, model)
    finally:
        _close(store)
    text = _dump(inp, outputs)
    if output:
        try:
            Path(output).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise InputError(f"{output}: cannot write: {exc.strerror or exc}") from exc
    else:
        click.echo(text, nl=False)
    for line in _table(rows, "<rrrr<r"):
        click.echo(line, err=True)


def _compact_all(
    config: Config, inp: Document, name: str, n: int | None, counter: Any, store: SessionRecorder | None, model: str | None = None
) -> tuple[list[list[Message]], list[list[str]]]:
    """Compact every session of ``inp`` through the library's turn
    (:meth:`ContextManager.prepare` with ``compact=True``): each session's messages recorded in
    the store under its id before anything is cut, the compaction and any window cut recorded
    as events. Returns the outputs and the report table's rows."""
    outputs: list[list[Message]] = []
    rows = [["session", "messages", "tokens", "after", "reduction", "engine", "ms"]]
    before_total = after_total = 0
    window_length = n or config.model.context_length or config.model.default_context_length
    cfg = config.with_overrides(context={"engine": name})
    # no model named: the window is given, so the name only labels the manager
    mgr = ContextManager(cfg, model=model or cfg.model.default or "compact", context_length=window_length, store=store)
    with _progress(inp.sessions, "compacting") as sessions:
        for session in sessions:
            sid = session.id
            before = counter.count_messages(session.messages)
            try:
                # recall=False: the file's reader gets no recall tools; markers say where the originals are
                out = mgr.prepare(session.messages, session_id=sid, compact=True, recall=False)
                engine_name = mgr.engine(sid).name
                done = mgr.status(sid).get("last_compaction") or {}
            except EngineError as exc:
                raise EngineError(f"{exc} (session {sid})") from exc
            finally:
                mgr.end_session(sid)  # a later entry with the same id starts over
            after = counter.count_messages(out)
            before_total += before
            after_total += after
            outputs.append(out)
            red = 1.0 - after / before if before else 0.0
            ms = float(done.get("elapsed_ms") or 0.0)
            rows.append([clean(sid), f"{len(session.messages)} → {len(out)}", f"{before:,}", f"{after:,}", f"{red:.1%}", engine_name, f"{ms:.1f}"])
    if len(inp.sessions) > 1:
        red = 1.0 - after_total / before_total if before_total else 0.0
        rows.append(["total", "", f"{before_total:,}", f"{after_total:,}", f"{red:.1%}", "", ""])
    return outputs, rows


@click.command()
@click.argument("file", metavar="FILE|-")
@click.option("--exact/--no-exact", default=True, show_default=True, help="Also count with tiktoken (o200k).")
def count(file: str, exact: bool) -> None:
    """Count messages and tokens of each session in FILE."""
    inp = _load(file)
    counter: ExactCounter | None = ExactCounter() if exact else None
    rows = [["session", "messages", "estimated", "exact"]]
    for session in inp.sessions:
        est = estimate_messages_tokens(session.messages)
        exact_cell = "n/a"
        if counter is not None:
            try:
                exact_cell = f"{counter.count_messages(session.messages):,}"
            except TokenizerError:
                counter = None  # the extra is not installed: say so once, per row
        rows.append([clean(session.id), str(len(session.messages)), f"{est:,}", exact_cell])
    for line in _table(rows, "<rrr"):
        click.echo(line)


@click.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="config.yaml to use.")
def engines(config_path: str | None) -> None:
    """List the selectable context engines and where each comes from."""
    config = load_config(config_path)
    registry = EngineRegistry(plugin_dirs=config.plugins.dirs, entry_points=config.plugins.entry_points)
    default = config.context.engine
    rows = [["engine", "source", "default"]]
    for row in registry.describe():
        rows.append([row["name"], row["source"], "*" if row["name"] == default else ""])
    for line in _table(rows, "<<<"):
        click.echo(line)
    for problem in registry.problems:
        click.echo(f"warning: plugin failed to load: {problem}", err=True)


COMMANDS = [compact, count, engines]
