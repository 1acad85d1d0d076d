"""Run inside the Hermes venv: Hermes' own agent loop against StubServer, ctxengine as engine.

Prints one JSON object with what happened; ``test_hermes_real.py`` asserts on it. Usage:
``python hermes_agent_loop.py WORKDIR TURNS [ENGINE]`` (ENGINE: the ctxengine engine, default
``compressor``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> None:
    work = Path(sys.argv[1])
    turns = int(sys.argv[2])
    engine_name = sys.argv[3] if len(sys.argv) > 3 else "compressor"
    home = work / "hermes-home"
    home.mkdir(parents=True, exist_ok=True)
    files = work / "files"
    files.mkdir(exist_ok=True)
    os.environ["HERMES_HOME"] = str(home)
    (home / "config.yaml").write_text(
        "plugins:\n  enabled: [ctxengine]\n"
        "context:\n  engine: ctxengine\n"
        "model:\n  context_length: 65536\n"
        "ctxengine:\n"
        f"  engine: {engine_name}\n"
        f"  store: {{backend: sqlite, path: {work / 'ctx.db'}}}\n",
        encoding="utf-8",
    )
    for i in range(turns):
        lines = [f"line {n} of module_{i}.py: value_{i}_{n} = compute({n}) # /src/pkg/module_{i}.py" for n in range(300)]
        (files / f"module_{i}.py").write_text("\n".join(lines) + "\n", encoding="utf-8")

    from ctxengine.messages import validate
    from ctxengine.testing import StubReply, StubServer

    def respond(request):  # type: ignore[no-untyped-def]
        msgs = request.body.get("messages") or []
        last = msgs[-1] if msgs else {}
        if last.get("role") == "user":
            text = last.get("content")
            if isinstance(text, list):
                text = " ".join(p.get("text", "") for p in text if isinstance(p, dict))
            if "recall:" in str(text):  # the model asks ctxengine's recall for a compacted fact
                offered = [t["function"]["name"] for t in request.body.get("tools") or []]
                grep = next(n for n in offered if n in ("ctx_grep", "lcm_grep"))
                return StubReply.calling((grep, {"query": "value_0_7 = compute(7)"}))
            i = int(str(text).split("#", 1)[1].split(":", 1)[0]) if "#" in str(text) else 0
            return StubReply.calling(("read_file", {"path": str(files / f"module_{i}.py")}))
        return StubReply.ok("Read it; module looks fine. " + "Analysis detail. " * 40)

    with StubServer(responder=respond) as server:
        from hermes_cli.plugins import get_plugin_context_engine
        from run_agent import AIAgent

        agent = AIAgent(
            base_url=server.openai_base_url,
            api_key="stub-key",
            model="stub-model",
            provider="custom",
            quiet_mode=True,
            enabled_toolsets=["file", "context_engine"],
            skip_context_files=True,
            skip_memory=True,
            max_iterations=8,
        )
        engine = agent.context_compressor
        history: list = []
        users: list[str] = []
        for i in range(turns):
            text = f"user message #{i}: please read module_{i}.py and check value_{i}_7"
            users.append(text)
            result = agent.run_conversation(text, conversation_history=history)
            history = result.get("messages") or history
        recall_q = "recall: what was value_0_7?"
        users.append(recall_q)
        result = agent.run_conversation(recall_q, conversation_history=history)
        history = result.get("messages") or history
        grep_results = [m.get("content") for m in history if m.get("role") == "tool" and "_grep" in json.dumps(history[max(0, history.index(m) - 1)])]
        invalid = []
        for k, req in enumerate(server.requests):
            msgs = req.body.get("messages") or []
            errs = [str(v) for v in validate(msgs, allow_pending_calls=True) if v.severity == "error"]
            if errs:
                invalid.append(f"request {k}: {errs[0]}")
        final = server.requests[-1].body.get("messages") or []
        final_text = json.dumps(final, ensure_ascii=False)
        missing_users = [u for u in users if u not in final_text]
        store = getattr(engine, "store", None)
        compactions = 0
        if store is not None:
            import sqlite3

            con = sqlite3.connect(str(work / "ctx.db"))
            try:
                compactions = con.execute("select count(*) from compactions").fetchone()[0]
            except sqlite3.Error as exc:
                compactions = f"error: {exc}"
        print(json.dumps({
            "plugin_engine": type(get_plugin_context_engine()).__name__,
            "engine_class": type(engine).__name__,
            "engine_name": engine.name,
            "requests": len(server.requests),
            "compression_count": engine.compression_count,
            "status": engine.get_status(),
            "invalid": invalid,
            "missing_users": missing_users,
            "final_messages": len(final),
            "compactions_in_store": compactions,
            "tools": [t["function"]["name"] for t in (agent.tools or [])],
            "recall_answer": grep_results[-1] if grep_results else None,
        }))


if __name__ == "__main__":
    main()
