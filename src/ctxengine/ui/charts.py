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
_L, _R, _T, _B = 64, 16, 16, 44  # margins: room for the axis labels


def tokens(n: float) -> str:
    """``1234567`` → ``1.2M`` (axis labels, bars)."""
    n = float(n)
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:.0f}"


def _axis(top: float, ticks: int = 5) -> str:
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
    for step in (1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
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
    last = len(points) - 1
    for i in sorted({0, len(points) // 2, last}):
        anchor, x = ("start", _L + slot * i) if i == 0 else ("end", _L + slot * (i + 1)) if i == last else ("middle", _L + slot * (i + 0.5))
        when = dt.datetime.fromtimestamp(float(points[i]["at"]), tz=dt.UTC).strftime("%m-%d %H:%M")
        out.append(f'<text x="{x:.1f}" y="{_H - _B + 16}" text-anchor="{anchor}" class="tick">{when} UTC</text>')
    out.append(_legend([("s-in", "tokens received"), ("s-out", "tokens sent")]))
    return _svg("".join(out), "tokens received and sent over time")


def requests_chart(requests: Sequence[dict[str, Any]]) -> str:
    """Each request: tokens received and sent (bars), the prompt the provider billed split into
    cache reads, cache writes and the rest (a stacked bar), and a marker over each request that
    compacted."""
    if not requests:
        return '<p class="empty">No requests of this session in the request log (it was recorded without the proxy).</p>'
    top = _nice(max(max(int(r["tokens_in"]), int(r["tokens_out"]), int(r["prompt_tokens"])) for r in requests))
    width, height = _W - _L - _R, _H - _T - _B
    slot = width / len(requests)
    bar = max(1.0, min(14.0, slot * 0.28))
    base = _T + height

    def h(v: float) -> float:
        return height * float(v) / top

    out = [_axis(top)]
    for i, r in enumerate(requests):
        x = _L + slot * i + (slot - 3 * bar) / 2
        read, write, prompt = int(r["cache_read_tokens"]), int(r["cache_write_tokens"]), int(r["prompt_tokens"])
        tip = (f"#{i + 1}: received {int(r['tokens_in']):,}, sent {int(r['tokens_out']):,}; billed prompt {prompt:,}: "
               f"cache read {read:,}, written {write:,}" + (f"; {int(r.get('compacted', r['compactions']))} compaction(s)" if r.get("compacted", r["compactions"]) else ""))
        out.append(f"<g><title>{escape(tip)}</title>")
        out.append(f'<rect x="{x:.1f}" y="{base - h(r["tokens_in"]):.1f}" width="{bar:.1f}" height="{h(r["tokens_in"]):.1f}" class="s-in"/>')
        out.append(f'<rect x="{x + bar:.1f}" y="{base - h(r["tokens_out"]):.1f}" width="{bar:.1f}" height="{h(r["tokens_out"]):.1f}" class="s-out"/>')
        y: float = base
        for value, cls in ((read, "s-read"), (write, "s-write"), (max(0, prompt - read - write), "s-rest")):
            if value:
                out.append(f'<rect x="{x + 2 * bar:.1f}" y="{y - h(value):.1f}" width="{bar:.1f}" height="{h(value):.1f}" class="{cls}"/>')
                y -= h(value)
        if r.get("compacted", r["compactions"]):
            cx = x + 1.5 * bar
            out.append(f'<path d="M{cx - 5:.1f},{_T - 2} L{cx + 5:.1f},{_T - 2} L{cx:.1f},{_T + 6}" class="s-comp"/>')
            out.append(f'<line x1="{cx:.1f}" x2="{cx:.1f}" y1="{_T + 6}" y2="{base:.1f}" class="s-comp-line"/>')
        out.append("</g>")
    out.append(_legend([("s-in", "received"), ("s-out", "sent"), ("s-read", "cache read"), ("s-write", "cache write"), ("s-rest", "uncached"), ("s-comp", "compaction")]))
    return _svg("".join(out), "tokens of each request")
