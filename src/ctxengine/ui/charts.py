"""Charts as inline SVG, drawn on the server (no script, no external asset): a time series of
tokens received and sent, and a session's requests as paired bars with cache reads and writes
and its compactions marked."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from html import escape
from typing import Any

__all__ = ["requests_chart", "series_chart", "tokens"]

_W, _H = 960, 240
_L, _R, _T, _B = 64, 16, 16, 36  # margins: room for the axis labels


def tokens(n: float) -> str:
    """``1234567`` → ``1.2M`` (axis labels, bars)."""
    n = float(n)
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:.0f}"


def _axis(top: float, ticks: int = 4) -> str:
    out = []
    for i in range(ticks + 1):
        v = top * i / ticks
        y = _H - _B - (_H - _T - _B) * i / ticks
        out.append(f'<line x1="{_L}" x2="{_W - _R}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        out.append(f'<text x="{_L - 8}" y="{y + 4:.1f}" text-anchor="end" class="tick">{tokens(v)}</text>')
    return "".join(out)


def _nice(top: float) -> float:
    if top <= 0:
        return 1.0
    mag = 10 ** (len(str(int(top))) - 1)
    for step in (1, 2, 2.5, 5, 10):
        if top <= step * mag:
            return float(step * mag)
    return float(10 * mag)


def _legend(items: Sequence[tuple[str, str]]) -> str:
    x = _L
    out = []
    for cls, label in items:
        out.append(f'<rect x="{x}" y="{_H - 14}" width="10" height="10" class="{cls}"/><text x="{x + 14}" y="{_H - 5}" class="tick">{escape(label)}</text>')
        x += 24 + 7 * len(label)
    return "".join(out)


def _svg(body: str, label: str) -> str:
    return f'<svg class="chart" viewBox="0 0 {_W} {_H}" role="img" aria-label="{escape(label)}" preserveAspectRatio="none">{body}</svg>'


def series_chart(points: Sequence[dict[str, Any]]) -> str:
    """Tokens received and sent per time bucket, as paired bars over time."""
    if not points:
        return '<p class="empty">No requests recorded yet.</p>'
    top = _nice(max(max(int(p["tokens_in"]), int(p["tokens_out"])) for p in points))
    width, height = _W - _L - _R, _H - _T - _B
    slot = width / len(points)
    bar = max(1.0, min(24.0, slot * 0.38))
    out = [_axis(top)]
    for i, p in enumerate(points):
        x = _L + slot * i + (slot - 2 * bar) / 2
        when = dt.datetime.fromtimestamp(float(p["at"]), tz=dt.UTC).strftime("%Y-%m-%d %H:%M")
        tip = f"{when} UTC: {int(p['requests']):,} requests, received {int(p['tokens_in']):,}, sent {int(p['tokens_out']):,}"
        out.append(f"<g><title>{escape(tip)}</title>")
        for k, (key, cls) in enumerate((("tokens_in", "s-in"), ("tokens_out", "s-out"))):
            h = height * float(p[key]) / top
            out.append(f'<rect x="{x + k * bar:.1f}" y="{_T + height - h:.1f}" width="{bar:.1f}" height="{h:.1f}" class="{cls}"/>')
        out.append("</g>")
    for i in sorted({0, len(points) // 2, len(points) - 1}):
        x = _L + slot * (i + 0.5)
        when = dt.datetime.fromtimestamp(float(points[i]["at"]), tz=dt.UTC).strftime("%m-%d %H:%M")
        out.append(f'<text x="{x:.1f}" y="{_H - _B + 14}" text-anchor="middle" class="tick">{when}</text>')
    out.append(_legend([("s-in", "tokens received"), ("s-out", "tokens sent")]))
    return _svg("".join(out), "tokens received and sent over time")


def requests_chart(requests: Sequence[dict[str, Any]]) -> str:
    """Each request: tokens received and sent (bars), cache reads and writes (ticks), and a
    marker over each request that compacted."""
    if not requests:
        return '<p class="empty">No requests of this session in the request log (it was recorded without the proxy).</p>'
    top = _nice(max(max(int(r["tokens_in"]), int(r["tokens_out"]), int(r["cache_read_tokens"]) + int(r["cache_write_tokens"])) for r in requests))
    width, height = _W - _L - _R, _H - _T - _B
    slot = width / len(requests)
    bar = max(1.0, slot * 0.4)

    def y(v: float) -> float:
        return _T + height * (1 - v / top)

    out = [_axis(top)]
    for i, r in enumerate(requests):
        x = _L + slot * i + slot * 0.1
        tip = f"#{i + 1}: received {int(r['tokens_in']):,}, sent {int(r['tokens_out']):,}, cache read {int(r['cache_read_tokens']):,}, written {int(r['cache_write_tokens']):,}"
        out.append(f"<g><title>{escape(tip)}</title>")
        out.append(f'<rect x="{x:.1f}" y="{y(r["tokens_in"]):.1f}" width="{bar:.1f}" height="{_T + height - y(r["tokens_in"]):.1f}" class="s-in"/>')
        out.append(f'<rect x="{x + bar:.1f}" y="{y(r["tokens_out"]):.1f}" width="{bar:.1f}" height="{_T + height - y(r["tokens_out"]):.1f}" class="s-out"/>')
        read, write = int(r["cache_read_tokens"]), int(r["cache_write_tokens"])
        if read:
            out.append(f'<line x1="{x + bar:.1f}" x2="{x + 2 * bar:.1f}" y1="{y(read):.1f}" y2="{y(read):.1f}" class="s-read"/>')
        if write:
            out.append(f'<line x1="{x + bar:.1f}" x2="{x + 2 * bar:.1f}" y1="{y(read + write):.1f}" y2="{y(read + write):.1f}" class="s-write"/>')
        if r.get("compacted", r["compactions"]):
            cx = x + bar
            out.append(f'<path d="M{cx - 5:.1f},{_T - 2} L{cx + 5:.1f},{_T - 2} L{cx:.1f},{_T + 6}" class="s-comp"/>')
        out.append("</g>")
    out.append(_legend([("s-in", "received"), ("s-out", "sent"), ("s-read", "cache read"), ("s-write", "cache write"), ("s-comp", "compaction")]))
    return _svg("".join(out), "tokens of each request")
