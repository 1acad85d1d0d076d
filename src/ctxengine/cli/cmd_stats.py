"""``ctxengine stats``: the dashboard's overview in the terminal, from the store's request log."""

from __future__ import annotations

import re
import time

import click

from ctxengine.cli.cmd_sessions import _config_option, _open, _store_option, _table
from ctxengine.errors import InputError
from ctxengine.textsafe import dumps
from ctxengine.ui.charts import tokens
from ctxengine.ui.data import overview

__all__ = ["COMMANDS", "stats"]

_BAR = 24
_UNITS = {"m": 60, "h": 3600, "d": 86400, "w": 604800}


def _since(value: str | None) -> float | None:
    if not value:
        return None
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([mhdw])\s*", value)
    if not found:
        raise InputError(f"--since {value!r}: give a duration such as 30m, 24h, 7d or 2w")
    return time.time() - float(found.group(1)) * _UNITS[found.group(2)]


def _usd(v: float | None) -> str:
    return "–" if v is None else (f"${v:,.4f}" if abs(v) < 1 else f"${v:,.2f}")


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{v:.0%}"


def _bar(saved: int, received: int) -> str:
    share = saved / received if received else 0.0
    full = round(share * _BAR)
    return "█" * full + "░" * (_BAR - full) + f" {share:.0%} saved"


@click.command()
@_store_option
@_config_option
@click.option("--since", help="Only requests of the last 30m, 24h, 7d, 2w … (default: all).")
@click.option("--json", "as_json", is_flag=True, help="The overview as JSON (what /ui/api/overview returns).")
def stats(store_path: str | None, config_path: str | None, since: str | None, as_json: bool) -> None:
    """What the proxy saved: requests, tokens received and sent, money at each model's prices.

    Reads the request log the proxy keeps in the session store (every proxy process sharing it).
    """
    with _open(store_path, config_path) as store:
        d = overview(store, since=_since(since))
    if as_json:
        click.echo(dumps(d, indent=2))
        return
    t = d["totals"]
    if not t["requests"]:
        click.echo("no requests in the store's request log yet (the proxy writes one row per request)")
        return
    click.echo(
        f"{t['requests']:,} requests in {d['sessions']:,} sessions: received {t['tokens_in']:,} tokens, sent {t['tokens_out']:,}, "
        f"saved {t['saved_tokens']:,} ({_pct(t['saved_tokens'] / t['tokens_in'] if t['tokens_in'] else None)})"
    )
    click.echo(
        f"billed {_usd(t['cost'])}, saved at least {_usd(t['saved'])} (at cache-read prices); cache reads {_pct(t['cache_read_share'])} of prompt tokens; "
        f"{t['compactions']:,} compactions, {t['fail_opens']:,} fail-opens, {t['errors']:,} errors"
        + (f"; {t['shadow']:,} requests in shadow mode" if t["shadow"] else "")
    )
    click.echo("")
    rows = d["by_model"]
    _table(
        ["model", "requests", "received", "sent", "saved", "cache reads", "compactions", "billed", "saved $", ""],
        [[r["model"] or "(none)", f"{r['requests']:,}", tokens(r["tokens_in"]), tokens(r["tokens_out"]), tokens(r["saved_tokens"]), _pct(r["cache_read_share"]),
          f"{r['compactions']:,}", _usd(r["cost"]), _usd(r["saved"]), _bar(int(r["saved_tokens"]), int(r["tokens_in"]))] for r in rows],
        "<>>>>>>>><",
    )
    if len(d["by_client"]) > 1 or (d["by_client"] and d["by_client"][0]["client"] != "(unnamed)"):
        click.echo("")
        _table(
            ["client", "requests", "received", "sent", "saved", "billed", "saved $"],
            [[r["client"], f"{r['requests']:,}", tokens(r["tokens_in"]), tokens(r["tokens_out"]), tokens(r["saved_tokens"]), _usd(r["cost"]), _usd(r["saved"])] for r in d["by_client"]],
            "<>>>>>>",
        )
    click.echo(f"\nprices: {d['price_source']}; a model without a price shows tokens only (–)")


COMMANDS = [stats]
