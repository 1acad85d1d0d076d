"""Hermes Agent's own compressor behind a JSON-lines pipe (run by the ``hermes`` bench baseline).

This file runs with the python of an environment where ``hermes-agent`` is installed, by path
(``python hermes_worker.py``), and imports nothing from ctxengine. One request per line on
stdin, one answer per line on stdout:

* ``{"cmd": "new", "id": K, "context_length": N, "model": M}`` builds a fresh
  ``ContextCompressor`` known as ``K`` (every other command names it too; ``drop`` forgets it);
* ``{"cmd": "usage", "usage": {...}}`` → ``update_from_response``;
* ``{"cmd": "should", "tokens": T}`` → ``{"ok": bool}``;
* ``{"cmd": "compress", "messages": [...], "current_tokens": T}`` →
  ``{"messages": [...], "elapsed_ms": ms, "count": compression_count}``; the time is measured
  around ``compress`` alone, so pipes and JSON do not count against Hermes.

No summarizer is configured (``HERMES_HOME`` points at an empty directory and no API key is
passed), so Hermes falls back to its own deterministic "summary unavailable" handoff, as it
does whenever its auxiliary model fails. Its summary-failure cooldown is set from the start, so
the time measured is the compaction's, not a provider lookup's.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any


def _warm_up(cls: Any, context_length: int) -> None:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "warm-up"}]
    for i in range(30):
        msgs += [
            {"role": "user", "content": f"step {i}"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": f"w{i}", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"w{i}", "content": f"line {i}\n" * 400},
        ]
    cls(model="anthropic/claude-sonnet-4.5", config_context_length=context_length, quiet_mode=True).compress(msgs, current_tokens=context_length)


def main() -> None:
    logging.disable(logging.CRITICAL)
    from agent.context_compressor import ContextCompressor

    engines: dict[Any, Any] = {}
    warmed = False
    out = sys.stdout
    sys.stdout = sys.stderr  # anything Hermes prints must not corrupt the protocol
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        cmd = req.get("cmd")
        key = req.get("id", 0)
        engine = engines.get(key)
        try:
            if cmd == "new":
                engine = engines[key] = ContextCompressor(
                    model=req.get("model") or "anthropic/claude-sonnet-4.5",
                    config_context_length=int(req["context_length"]),
                    quiet_mode=True,
                )
                # the summarizer is known to be unavailable: go straight to Hermes' fallback handoff
                # (without this each fresh compressor first scans every provider's credentials
                # for an auxiliary model, ~0.3 s, then sets this same cooldown itself)
                engine._summary_failure_cooldown_until = float("inf")
                if not warmed:  # first-call imports and provider lookups are not compaction time
                    _warm_up(ContextCompressor, int(req["context_length"]))
                    warmed = True
                answer: dict[str, Any] = {"ok": True, "context_length": engine.context_length, "threshold_tokens": engine.threshold_tokens}
            elif cmd == "drop":
                engines.pop(key, None)
                answer = {"ok": True}
            elif engine is None:
                answer = {"error": f"no compressor {key!r}: send 'new' first"}
            elif cmd == "usage":
                engine.update_from_response(req.get("usage") or {})
                answer = {"ok": True}
            elif cmd == "should":
                answer = {"ok": bool(engine.should_compress(int(req["tokens"])))}
            elif cmd == "compress":
                t0 = time.perf_counter()
                msgs = engine.compress(req["messages"], current_tokens=req.get("current_tokens"))
                elapsed = (time.perf_counter() - t0) * 1000.0
                answer = {"messages": msgs, "elapsed_ms": elapsed, "count": engine.compression_count}
            else:
                answer = {"error": f"unknown command {cmd!r}"}
        except Exception as exc:  # reported to the parent, which raises it
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(answer, default=str) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
