"""``ctxengine sessions``: browse, search, export and restore the session store.

The store is the one ``store:`` in the config describes (SQLite under the user data directory
by default), or the SQLite file given with ``--store``. Points (``--at``) name a state of a
session: ``latest``, ``event:N``, ``before:<compaction id>``, ``after:<compaction id>``,
``message:<message id>``; ``sessions show`` lists them.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import click

from ctxengine.config import load_config
from ctxengine.errors import InputError, NotFoundError
from ctxengine.io import loads_json, read_text
from ctxengine.messages import content_text, message_text
from ctxengine.store import SessionStore, SqliteStore, open_store
from ctxengine.store.export_doc import validate_export
from ctxengine.textsafe import clean, dumps

__all__ = ["COMMANDS", "sessions"]

_PREVIEW = 70


def _open(store_path: str | None, config_path: str | None) -> SessionStore:
    if store_path:
        return SqliteStore(store_path)
    return open_store(load_config(config_path).store)


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _preview(text: str, width: int = _PREVIEW) -> str:
    one = " ".join(clean(text).split())
    return one if len(one) <= width else one[: width - 1] + "…"


def _table(header: list[str], rows: list[list[str]], align: str) -> None:
    """Print an aligned table (``align``: one ``<`` or ``>`` per column)."""
    if not rows:
        return
    allrows = [header, *[[clean(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in allrows) for i in range(len(header))]
    for n, r in enumerate(allrows):
        cells = [c.ljust(w) if a == "<" else c.rjust(w) for c, w, a in zip(r, widths, align, strict=True)]
        click.echo("  ".join(cells).rstrip())
        if n == 0:
            click.echo("  ".join("-" * w for w in widths))


def _write(text: str, output: str | None) -> None:
    if output:
        try:
            Path(output).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise InputError(f"{output}: cannot write: {exc.strerror or exc}") from exc
    else:
        click.echo(text)


_store_option = click.option("--store", "store_path", type=click.Path(dir_okay=False), help="SQLite store file (default: store: in the config).")
_config_option = click.option("--config", "config_path", type=click.Path(dir_okay=False), help="config.yaml to use.")


@click.group()
def sessions() -> None:
    """Browse, search, export and restore recorded sessions."""


@sessions.command("list")
@_store_option
@_config_option
@click.option("--limit", type=int, default=50, show_default=True, help="Most sessions to show.")
@click.option("--json", "as_json", is_flag=True, help="JSON instead of a table.")
def list_cmd(store_path: str | None, config_path: str | None, limit: int, as_json: bool) -> None:
    """List sessions, most recently updated first."""
    with _open(store_path, config_path) as store:
        infos = store.list_sessions(limit=limit)
    if as_json:
        click.echo(dumps([{"id": s.id, "tip": s.tip, "length": s.length, "stored": s.stored, "compactions": s.compactions, "created_at": s.created_at, "updated_at": s.updated_at} for s in infos], indent=2))
        return
    if not infos:
        click.echo("no sessions in the store")
        return
    _table(
        ["session", "messages", "stored", "compactions", "updated (UTC)"],
        [[s.id, f"{s.length:,}", f"{s.stored:,}", str(s.compactions), _when(s.updated_at)] for s in infos],
        "<>>><",
    )


@sessions.command()
@click.argument("session_id")
@_store_option
@_config_option
@click.option("--messages/--no-messages", default=True, show_default=True, help="List the current history.")
@click.option("--at", "point", default="latest", show_default=True, help="Point whose history to list.")
def show(session_id: str, store_path: str | None, config_path: str | None, messages: bool, point: str) -> None:
    """Show a session: its events (restorable points), compactions and history."""
    with _open(store_path, config_path) as store:
        info = store.get_session(session_id)
        events = store.events(session_id)
        comps = store.compactions(session_id)
        ids = store.history_ids(session_id, point) if messages else []
        history = store.get_messages(ids) if ids else []
    click.echo(f"session {clean(info.id)}: {info.length:,} messages in the current history, {info.stored:,} stored, {info.compactions} compaction(s)")
    click.echo(f"created {_when(info.created_at)} UTC, updated {_when(info.updated_at)} UTC")
    if info.meta:
        click.echo(f"meta: {dumps(info.meta)}")
    if events:
        click.echo("\nevents (restore with --at event:N):")
        _table(["#", "kind", "messages", "compaction", "at (UTC)"], [[str(e.number), e.kind, f"{e.length:,}", e.compaction or "", _when(e.created_at)] for e in events], "><><<")
    if comps:
        click.echo("\ncompactions (points before:<id> and after:<id>):")
        _table(
            ["id", "engine", "tokens before", "after", "reduction", "replaced", "at (UTC)"],
            [
                [c.id, c.engine, f"{c.tokens_before:,}", f"{c.tokens_after:,}", f"{1 - c.tokens_after / c.tokens_before:.1%}" if c.tokens_before else "", str(len(c.replaced)), _when(c.created_at)]
                for c in comps
            ],
            "<<>>>><",
        )
    if history:
        click.echo(f"\nhistory at {point}:")
        _table(["#", "id", "role", "text"], [[str(i), mid[:12], str(m.get("role")), _preview(message_text(m))] for i, (mid, m) in enumerate(zip(ids, history, strict=True))], "><<<")


@sessions.command()
@click.argument("query")
@_store_option
@_config_option
@click.option("--session", "session_id", help="Search this session only (default: all).")
@click.option("--regex", is_flag=True, help="QUERY is a regular expression (RE2 syntax: linear time, no backreferences or lookarounds).")
@click.option("--limit", type=int, default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="JSON instead of a table.")
def search(query: str, store_path: str | None, config_path: str | None, session_id: str | None, regex: bool, limit: int, as_json: bool) -> None:
    """Find messages and summaries containing QUERY (case-insensitive)."""
    with _open(store_path, config_path) as store:
        hits = store.search(query, session_id=session_id, mode="regex" if regex else "text", limit=limit)
    if as_json:
        click.echo(dumps([h.to_dict() for h in hits], indent=2))
        return
    if not hits:
        click.echo(f"no match for {clean(query)!r}")
        return
    _table(
        ["kind", "id", "session", "role", "match"],
        [[h.kind, h.id[:16], ",".join(h.session_ids[:2]) + ("…" if len(h.session_ids) > 2 else ""), h.role, _preview(h.snippet, 90)] for h in hits],
        "<<<<<",
    )


@sessions.command()
@click.argument("session_id")
@_store_option
@_config_option
@click.option("--at", "point", help="Write the message list at this point instead of the full export.")
@click.option("--originals", is_flag=True, help="Write the full uncompacted history (every compaction undone).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), help="Write here instead of stdout.")
def export(session_id: str, store_path: str | None, config_path: str | None, point: str | None, originals: bool, output: str | None) -> None:
    """Export a session: everything (for `sessions restore --from`), or its messages at a point."""
    if point and originals:
        raise click.UsageError("--at and --originals are exclusive")
    with _open(store_path, config_path) as store:
        if originals:
            data: Any = store.originals(session_id)
        elif point:
            data = store.history(session_id, point)
        else:
            data = store.export_session(session_id)
    _write(dumps(data, indent=2), output)


@sessions.command()
@click.argument("session_id", required=False)
@click.argument("point", required=False)
@_store_option
@_config_option
@click.option("--from", "from_file", type=click.Path(dir_okay=False, exists=True, allow_dash=True), help="Import an export document (`sessions export`) into the store.")
@click.option("--as", "as_id", help="With --from: import under this session id.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), help="Write the restored messages here.")
def restore(session_id: str | None, point: str | None, store_path: str | None, config_path: str | None, from_file: str | None, as_id: str | None, output: str | None) -> None:
    """Restore SESSION to POINT (a new event; nothing is lost), or import an export with --from.

    POINT: event:N, before:<compaction id>, after:<compaction id>, message:<id> (see `sessions show`).
    """
    if from_file:
        source = "<stdin>" if from_file == "-" else from_file
        doc = loads_json(read_text(from_file, "session export"), source)
        if not isinstance(doc, dict):
            raise InputError(f"{source}: not a session export (a JSON object from `ctxengine sessions export`), got a {type(doc).__name__}")
        try:  # every record checked before the store is opened: a damaged file writes nothing
            validate_export(doc)
        except InputError as exc:
            raise InputError(f"{source}: {exc}") from None
        with _open(store_path, config_path) as store:
            sid = store.import_session(doc, session_id=as_id or session_id)
            info = store.get_session(sid)
        click.echo(f"imported session {clean(sid)}: {info.length:,} messages, {info.stored:,} stored, {info.compactions} compaction(s)", err=True)
        return
    if not session_id or not point:
        raise click.UsageError("give SESSION and POINT, or --from FILE")
    with _open(store_path, config_path) as store:
        messages = store.restore(session_id, point)
    click.echo(f"session {session_id} restored to {point}: {len(messages):,} messages", err=True)
    if output:
        _write(dumps(messages, indent=2), output)
    else:
        for i, m in enumerate(messages[-10:], start=max(0, len(messages) - 10)):
            click.echo(f"{i:>5}  {m.get('role')!s:<9}  {_preview(content_text(m.get('content')) or message_text(m))}", err=True)


@sessions.command()
@click.argument("session_id")
@click.argument("compaction_id", required=False)
@_store_option
@_config_option
@click.option("--full", is_flag=True, help="Print each stand-in's whole text (default: its first lines).")
@click.option("--json", "as_json", is_flag=True, help="JSON instead of tables.")
def audit(session_id: str, compaction_id: str | None, store_path: str | None, config_path: str | None, full: bool, as_json: bool) -> None:
    """What each compaction of SESSION removed and what stands in its place (or COMPACTION only).

    Every message removed or changed (position, role, tokens, facts kept in the compacted
    context), then the digests, summaries and cut markers that replaced them; the originals are
    one `sessions export SESSION --at before:<compaction>` away (or ctx_expand's ref).
    """
    from ctxengine.ui.data import audit as audit_of

    with _open(store_path, config_path) as store:
        comps = store.compactions(session_id)
        if compaction_id:
            comps = [c for c in comps if c.id == compaction_id or c.id.startswith(compaction_id)]
            if not comps:
                raise NotFoundError(f"no compaction {compaction_id!r} in session {session_id!r}")
        audits = [audit_of(store, c.id) for c in comps]
    if as_json:
        click.echo(dumps(audits, indent=2))
        return
    if not audits:
        click.echo(f"session {clean(session_id)} has no compaction")
    for a in audits:
        _print_audit(a, full)


def _print_audit(a: dict[str, Any], full: bool) -> None:
    click.echo(
        f"compaction {a['id']} ({a['engine']}, {_when(a['at'])} UTC): {a['messages_before']:,} → {a['messages_after']:,} messages, "
        f"{a['tokens_before']:,} → {a['tokens_after']:,} tokens"
    )
    click.echo(f"\nremoved or changed ({len(a['removed'])}):")
    _table(
        ["#", "id", "role", "tokens", "facts kept", "text"],
        [[str(r["position"]), r["id"][:12], r["role"], f"{r['tokens']:,}", f"{r['facts_kept']}/{r['facts']}", _preview(r["preview"], 60)] for r in a["removed"]],
        "><<>><",
    )
    click.echo(f"\nin their place ({len(a['stand_ins'])}):")
    for s in a["stand_ins"]:
        ref = f", originals: ref {s['ref']}" if s.get("ref") else ""
        click.echo(f"  [{s['kind']}] position {s['position']}, {s['role']}, {s['tokens']:,} tokens{ref}")
        lines = clean(s["text"]).splitlines()
        for line in lines if full else lines[:4]:
            click.echo(f"    {line}")
        if not full and len(lines) > 4:
            click.echo(f"    … {len(lines) - 4} more lines (--full)")
    click.echo("")


COMMANDS = [sessions]
