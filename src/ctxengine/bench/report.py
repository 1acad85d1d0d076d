"""Showing a benchmark: a terminal table, JSON, and a chart (PNG or self-contained HTML).

The chart has three panels: context tokens per call for each engine on the longest session,
with a marker at every compaction and the window as a line; the Anthropic- and OpenAI-priced
input cost of each engine over all sessions; and cost (relative to no compaction) against the
share of facts kept, one point per configuration, baselines and Hermes' compressor included. PNG needs matplotlib (imported
only here, with the Agg backend); HTML is inline SVG with no script and no external asset.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from ctxengine.bench.probe import TOP
from ctxengine.bench.replay import percentile
from ctxengine.bench.runner import DEFAULT, BenchResult, EngineTotals
from ctxengine.bench.uses import BUCKETS
from ctxengine.errors import InputError
from ctxengine.facts import FACT_KINDS

__all__ = ["cost_and_facts", "format_table", "ranked", "summary_line", "write_chart", "write_json"]

_KIND_LABEL = {"users": "user", "paths": "path", "urls": "url", "tools": "tool", "errors": "err"}


def _money(x: float) -> str:
    return f"${x:,.2f}" if x >= 1 else f"${x:.4f}"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _ratio(t: EngineTotals, base: EngineTotals | None, attr: str) -> str:
    if base is None or getattr(base, attr) <= 0:
        return "-"
    return f"{getattr(t, attr) / getattr(base, attr):.2f}×"


def format_table(result: BenchResult) -> str:
    """The side-by-side table printed by ``ctxengine bench``."""
    lines = _aligned(_table_rows(result))
    title = (
        f"{len(result.sessions)} session(s), window {result.context_length:,} tokens, placement {result.placement}, "
        f"cache TTL {result.cache_ttl}" + (f", {result.pause:g} s pause between tasks" if result.pause else "") + "; "
        f"input cost priced as {result.anthropic_model} (Anthropic cache) and {result.openai_model} (OpenAI cache); "
        f"facts kept = verbatim in the last request or retrievable from the engine; {result.elapsed_s:.1f} s"
    )
    lines += _hermes_line(result) + _search_line(result)
    return title + "\n" + "\n".join(lines) + "\n" + summary_line(result)


def _table_rows(result: BenchResult) -> list[list[str]]:
    """The table's head and one row per engine."""
    base = result.engines.get("none")
    head = [
        "engine",
        "calls",
        "anthropic",
        "×none",
        "no cache",
        "openai",
        "×none",
        "no cache",
        "peak tok",
        "compact",
        "p50 ms",
        "p95 ms",
        "invalid",
        "over",
        *(_KIND_LABEL[k] for k in FACT_KINDS),
        "facts",
        "in view",
        ">10 back",
    ]
    rows = [head]
    for name, t in result.engines.items():
        d = t.to_dict(base)
        rows.append(
            [
                result.label(name),
                str(t.calls),
                _money(t.anthropic_cost),
                _ratio(t, base, "anthropic_cost"),
                _money(t.anthropic_no_cache),
                _money(t.openai_cost),
                _ratio(t, base, "openai_cost"),
                _money(t.openai_no_cache),
                f"{t.peak_tokens:,}",
                str(t.compactions),
                f"{d['latency_p50_ms']:.1f}",
                f"{d['latency_p95_ms']:.1f}",
                str(t.invalid_requests),
                str(t.over_window),
                *(_pct(t.retention(k)) for k in FACT_KINDS),
                _pct(t.retention()),
                _pct(t.in_view().share()),
                _pct(t.in_view().share((BUCKETS[-1],))),
            ]
        )
    return rows


def _aligned(rows: list[list[str]]) -> list[str]:
    """The rows as aligned text lines (first column left, the others right), a rule under the head."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for n, r in enumerate(rows):
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def _hermes_line(result: BenchResult) -> list[str]:
    """The compaction p50 of each engine relative to Hermes' compressor (none without it)."""
    base = result.engines.get("none")
    hermes = result.engines.get("hermes")
    if hermes is None or not hermes.latencies_ms:
        return []
    ratios = [
        f"{result.label(name)} {d['latency_p50_vs_hermes']:.2f}×"
        for name, t in result.engines.items()
        if name != "hermes" and "latency_p50_vs_hermes" in (d := t.to_dict(base, hermes))
    ]
    if not ratios:
        return []
    return [f"compaction p50 relative to Hermes' compressor ({percentile(hermes.latencies_ms, 50):.1f} ms): " + ", ".join(ratios)]


def _search_line(result: BenchResult) -> list[str]:
    """What one realistic ctx_grep got back of the removed facts, per engine that was searched."""
    searched = []
    for name, t in result.engines.items():
        total, _found = t.search()
        if sum(total.values()):
            kinds = ", ".join(f"{k} {_pct(t.search_recall(k))}" for k in total if total[k])
            d = t.to_dict()
            share, n = t.distinct_recall()
            plain, _n = t.plain_recall()
            searched.append(
                f"{result.label(name)} {_pct(t.search_recall())} of {sum(total.values())} ({kinds};"
                f" distinctive queries {_pct(share)} of {n}; bare queries {_pct(plain)};"
                f" p50 {d['search_p50_ms']:.1f} ms, largest answer {d['search_answer_max_tokens']:,} tokens)"
            )
    if not searched:
        return []
    return [f"removed facts back from one realistic ctx_grep, first {TOP} results: " + "; ".join(searched)]


def ranked(result: BenchResult) -> list[str]:
    """The configurations other than ``none``, cheapest first (Anthropic-priced input cost,
    then OpenAI-priced; ties keep the order they ran in)."""
    names = [n for n in result.engines if n != "none"]
    return sorted(names, key=lambda n: (result.engines[n].anthropic_cost, result.engines[n].openai_cost))


def summary_line(result: BenchResult) -> str:
    """One line ranking the configurations by cost, cheapest first: each one's Anthropic-priced
    cost vs no compaction (and OpenAI-priced), invalid and over-window requests and fact
    retention (``default`` is the manager's defaults)."""
    base = result.engines.get("none")
    parts = []
    for rank, name in enumerate(ranked(result), 1):
        t = result.engines[name]
        ratio = _ratio(t, base, "anthropic_cost").replace("-", "?")
        openai = _ratio(t, base, "openai_cost").replace("-", "?")
        parts.append(
            f"{rank}. {result.label(name)} {ratio} none (OpenAI {openai}), {t.invalid_requests} invalid, "
            f"{t.over_window} over-window, {_pct(t.retention())} facts"
        )
    return "summary, cheapest first: " + ("; ".join(parts) if parts else "only the no-compaction baseline ran")


def cost_and_facts(result: BenchResult) -> list[tuple[str, float, float]]:
    """(label, Anthropic-priced cost relative to no compaction, share of facts kept) of every
    configuration that ran, the baselines (``none``, ``hermes``) included; cost is absolute USD
    when ``none`` did not run."""
    base = result.engines.get("none")
    scale = base.anthropic_cost if base is not None and base.anthropic_cost > 0 else 1.0
    return [(result.label(n), t.anthropic_cost / scale, t.retention()) for n, t in result.engines.items()]


def write_json(result: BenchResult, path: str | Path, *, per_call: bool = True) -> None:
    """Write the full result (per-engine totals and every run) as JSON."""
    try:
        Path(path).write_text(json.dumps(result.to_dict(per_call=per_call), indent=2, ensure_ascii=False), encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot write: {exc.strerror or exc}") from exc


def _longest(result: BenchResult) -> tuple[str, dict[str, tuple[list[int], list[int]]]]:
    """The longest session and, per engine, its tokens per call and compaction calls."""
    any_engine = next(iter(result.engines.values()))
    longest = max(any_engine.runs, key=lambda r: r.calls).session_id if any_engine.runs else ""
    series: dict[str, tuple[list[int], list[int]]] = {}
    for name, t in result.engines.items():
        for r in t.runs:
            if r.session_id == longest:
                series[result.label(name)] = (r.request_tokens, r.compaction_calls)
    return longest, series


def write_chart(result: BenchResult, path: str | Path) -> None:
    """Write the chart as ``.png`` (matplotlib) or ``.html`` (inline SVG), by extension."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix == ".png":
        _png(result, p)
    elif suffix in (".html", ".htm"):
        try:
            p.write_text(_html(result), encoding="utf-8")
        except OSError as exc:
            raise InputError(f"{p}: cannot write: {exc.strerror or exc}") from exc
    else:
        raise InputError(f"{p}: chart must end in .png or .html")


def _png(result: BenchResult, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise InputError("a PNG chart needs matplotlib (pip install matplotlib), or use --chart OUT.html") from exc
    longest, series = _longest(result)
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(19, 5), gridspec_kw={"width_ratios": [2, 1, 1]})
    for name, (toks, comps) in series.items():
        (line,) = ax1.plot(range(len(toks)), toks, label=name, linewidth=1.2)
        ax1.scatter(comps, [toks[c] for c in comps if c < len(toks)], marker="v", s=18, color=line.get_color())
    ax1.axhline(result.context_length, color="black", linestyle="--", linewidth=0.8, label="window")
    ax1.set_title(f"context tokens per call — {longest} (▼ compaction)")
    ax1.set_xlabel("call")
    ax1.set_ylabel("tokens")
    ax1.legend(fontsize=8)
    names = list(result.engines)
    xs = range(len(names))
    ax2.bar([x - 0.2 for x in xs], [result.engines[n].anthropic_cost for n in names], width=0.4, label="Anthropic (cached)")
    ax2.bar([x + 0.2 for x in xs], [result.engines[n].openai_cost for n in names], width=0.4, label="OpenAI (cached)")
    ax2.set_xticks(list(xs))
    ax2.set_xticklabels([result.label(n) for n in names], rotation=30, ha="right")
    ax2.set_ylabel("input cost, USD")
    ax2.set_title("input cost per engine (all sessions)")
    ax2.legend(fontsize=8)
    for label, cost, kept in cost_and_facts(result):
        ax3.scatter([cost], [100 * kept], s=30)
        ax3.annotate(label, (cost, 100 * kept), fontsize=7, xytext=(4, 4), textcoords="offset points")
    ax3.set_xlabel("input cost (Anthropic cache), × no compaction")
    ax3.set_ylabel("facts kept, %")
    ax3.set_title("cost against facts kept (lower right is better)")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise InputError(f"{path}: cannot write: {exc.strerror or exc}") from exc
    finally:
        plt.close(fig)


_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


def _svg_lines(result: BenchResult, width: int = 820, height: int = 360) -> str:
    longest, series = _longest(result)
    pad_l, pad_b, pad_t, pad_r = 70, 40, 30, 130
    max_calls = max((len(t) for t, _ in series.values()), default=1)
    ymax = max([result.context_length, *(max(t, default=0) for t, _ in series.values())])
    w = width - pad_l - pad_r
    h = height - pad_t - pad_b

    def x(i: float) -> float:
        return pad_l + w * i / max(1, max_calls - 1)

    def y(v: float) -> float:
        return pad_t + h * (1 - v / ymax)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">']
    parts.append(f'<text x="{pad_l}" y="18" font-size="13">context tokens per call — {html.escape(longest)} (▼ compaction)</text>')
    parts.append(f'<line x1="{pad_l}" y1="{pad_t + h}" x2="{pad_l + w}" y2="{pad_t + h}" stroke="#333"/>')
    parts.append(f'<line x1="{pad_l}" y1="{pad_t}" x2="{pad_l}" y2="{pad_t + h}" stroke="#333"/>')
    for k in range(5):
        v = ymax * k / 4
        parts.append(f'<text x="{pad_l - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{int(v):,}</text>')
    wy = y(result.context_length)
    parts.append(f'<line x1="{pad_l}" y1="{wy:.1f}" x2="{pad_l + w}" y2="{wy:.1f}" stroke="#000" stroke-dasharray="4 3"/>')
    parts.append(f'<text x="{pad_l + w + 4}" y="{wy + 4:.1f}">window</text>')
    for n, (name, (toks, comps)) in enumerate(series.items()):
        color = _COLORS[n % len(_COLORS)]
        pts = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(toks))
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.4" points="{pts}"/>')
        for c in comps:
            if c < len(toks):
                cx, cy = x(c), y(toks[c])
                parts.append(f'<path d="M{cx - 4:.1f},{cy - 7:.1f} L{cx + 4:.1f},{cy - 7:.1f} L{cx:.1f},{cy - 1:.1f} Z" fill="{color}"/>')
        parts.append(f'<rect x="{pad_l + w + 10}" y="{pad_t + 20 + 16 * n}" width="10" height="10" fill="{color}"/>')
        parts.append(f'<text x="{pad_l + w + 24}" y="{pad_t + 29 + 16 * n}">{html.escape(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _svg_bars(result: BenchResult, width: int = 820, height: int = 300) -> str:
    names = list(result.engines)
    pad_l, pad_b, pad_t = 70, 50, 30
    w = width - pad_l - 20
    h = height - pad_t - pad_b
    vmax = max([1e-9, *(max(t.anthropic_cost, t.openai_cost) for t in result.engines.values())])
    slot = w / max(1, len(names))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">']
    parts.append(f'<text x="{pad_l}" y="18" font-size="13">input cost per engine, all sessions (blue: Anthropic cache, orange: OpenAI cache)</text>')
    for n, name in enumerate(names):
        t = result.engines[name]
        for k, (val, color) in enumerate(((t.anthropic_cost, _COLORS[0]), (t.openai_cost, _COLORS[1]))):
            bh = h * val / vmax
            bx = pad_l + n * slot + slot * (0.15 + 0.35 * k)
            parts.append(f'<rect x="{bx:.1f}" y="{pad_t + h - bh:.1f}" width="{slot * 0.33:.1f}" height="{bh:.1f}" fill="{color}"/>')
            parts.append(f'<text x="{bx + slot * 0.16:.1f}" y="{pad_t + h - bh - 3:.1f}" text-anchor="middle">{_money(val)}</text>')
        weight = ' font-weight="bold"' if name == DEFAULT else ""
        parts.append(f'<text x="{pad_l + n * slot + slot / 2:.1f}" y="{pad_t + h + 16}" text-anchor="middle"{weight}>{html.escape(result.label(name))}</text>')
    parts.append(f'<line x1="{pad_l}" y1="{pad_t + h}" x2="{pad_l + w}" y2="{pad_t + h}" stroke="#333"/>')
    parts.append("</svg>")
    return "".join(parts)


def _svg_scatter(result: BenchResult, width: int = 820, height: int = 340) -> str:
    """Cost against facts kept, one labelled point per configuration."""
    points = cost_and_facts(result)
    pad_l, pad_b, pad_t, pad_r = 70, 45, 30, 160
    w, h = width - pad_l - pad_r, height - pad_t - pad_b
    xmax = max([1e-9, *(c for _, c, _ in points)]) * 1.1
    ymin = min([1.0, *(k for _, _, k in points)])
    ymin = max(0.0, ymin - 0.05)

    def y(v: float) -> float:
        return pad_t + h * (1 - (v - ymin) / max(1e-9, 1.0 - ymin))

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">']
    parts.append(f'<text x="{pad_l}" y="18" font-size="13">cost (Anthropic cache, × no compaction) against facts kept — lower right is better</text>')
    parts.append(f'<line x1="{pad_l}" y1="{pad_t + h}" x2="{pad_l + w}" y2="{pad_t + h}" stroke="#333"/>')
    parts.append(f'<line x1="{pad_l}" y1="{pad_t}" x2="{pad_l}" y2="{pad_t + h}" stroke="#333"/>')
    for k in range(5):
        xv, yv = xmax * k / 4, ymin + (1.0 - ymin) * k / 4
        parts.append(f'<text x="{pad_l + w * k / 4:.1f}" y="{pad_t + h + 16}" text-anchor="middle">{xv:.2f}×</text>')
        parts.append(f'<text x="{pad_l - 6}" y="{y(yv) + 4:.1f}" text-anchor="end">{100 * yv:.0f}%</text>')
    for n, (label, cost, kept) in enumerate(points):
        color = _COLORS[n % len(_COLORS)]
        cx, cy = pad_l + w * cost / xmax, y(kept)
        parts.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="5" fill="{color}"/>')
        parts.append(f'<text x="{cx + 7:.1f}" y="{cy - 6 - 11 * (n % 3):.1f}">{html.escape(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _html(result: BenchResult) -> str:
    table = html.escape(format_table(result))
    data: dict[str, Any] = result.to_dict(per_call=False)["engines"]
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>ctxengine bench</title>"
        "<style>body{font-family:sans-serif;margin:24px}pre{font-size:12px;background:#f6f6f6;padding:12px;overflow-x:auto}</style>"
        "</head><body><h1>ctxengine bench</h1>"
        f"<p>{html.escape(summary_line(result))}</p>"
        f"{_svg_lines(result)}<br>{_svg_bars(result)}<br>{_svg_scatter(result)}<pre>{table}</pre>"
        f"<details><summary>totals (JSON)</summary><pre>{html.escape(json.dumps(data, indent=2))}</pre></details>"
        "</body></html>"
    )
