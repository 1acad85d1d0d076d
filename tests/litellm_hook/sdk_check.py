"""Run inside the LiteLLM venv (tests/litellm/test_litellm.py starts it): ctxengine under the
LiteLLM SDK with one line (``litellm.callbacks = [hook]``), and the hook failing open.

    python sdk_check.py WORKDIR   # prints one JSON object

1. ``sdk``: an 8-step tool task (3K-token files, a 20K window) through ``litellm.acompletion``
   against the strict upstream, the hook in ``litellm.callbacks``;
2. ``capped``: a hook whose planning raises, given a history over the window: the call still
   succeeds, what reaches the upstream is held under the window by the window cap alone;
3. ``naming``, ``retry``: how sessions are named; a call LiteLLM sends twice;
4. ``unchanged``: planning and the window cap both raise: the call goes as it came;
5. ``shadow`` (``python sdk_check.py WORKDIR shadow``, a process of its own): a hook in shadow mode (``proxy.shadow``) sends the over-window history unchanged
   and logs, per call, what it would have sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import litellm

from ctxengine.config import Config
from ctxengine.integrations.litellm import CtxEngineHook
from ctxengine.store.sqlite import SqliteStore
from ctxengine.testing.strict_upstream import StrictUpstream, Task, count_request_tokens

READ = {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}
MODEL = "openai/agent-model"
WINDOW = 20_000


def _hook(work: Path, name: str, *, shadow: bool = False) -> CtxEngineHook:
    config = Config.from_dict({"models": {MODEL: {"context_length": WINDOW}}, "proxy": {"shadow": shadow}})
    return CtxEngineHook(config, store=SqliteStore(work / f"{name}.db"))


async def _shadow(up: StrictUpstream, work: Path, history: list[dict[str, Any]]) -> dict[str, Any]:
    """Shadow mode: the history grows past the window one turn at a time; every call reaches
    the upstream unchanged, and the request log says what ctxengine would have sent."""
    up.reset()
    hook = _hook(work, "shadow", shadow=True)
    litellm.callbacks = [hook]
    ends = list(range(3, len(history), 2))
    for end in ends:
        with contextlib.suppress(Exception):  # the upstream rejects the unchanged calls over the window
            await litellm.acompletion(model=MODEL, api_base=up.openai_base_url, api_key="sk-upstream", messages=history[:end], tools=[READ])
    await asyncio.sleep(1.0)  # the shadow plans run after the responses
    hook.close()
    store = SqliteStore(work / "shadow.db")
    rows = [r for s in store.list_sessions() for r in store.requests(s.id)]
    return {
        "calls": len(ends),
        "over_window": up.stats["over_window"],
        "rows": len(rows),
        "shadow_rows": sum(1 for r in rows if r.shadow),
        "would_save": sum(max(0, r.tokens_in - r.tokens_out) for r in rows),
        "compactions": sum(r.compactions for r in rows),
    }


async def _task(up: StrictUpstream, task: Task) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": task.prompt}]
    for _ in range(task.steps + 3):
        r = await litellm.acompletion(model=MODEL, api_base=up.openai_base_url, api_key="sk-upstream", messages=messages, tools=[READ])
        msg = r.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            break
        for call in msg.tool_calls:
            path = Path(json.loads(call.function.arguments)["path"])
            messages.append({"role": "tool", "tool_call_id": call.id, "content": path.read_text()})
    return messages


async def _naming(up: StrictUpstream, work: Path, opening: list[dict[str, Any]]) -> list[str]:
    """The same opening sent as four conversations named four ways: the stored session ids."""
    hook = _hook(work, "naming")
    litellm.callbacks = [hook]
    ways: list[dict[str, Any]] = [
        {"litellm_session_id": "conv-a"},
        {"metadata": {"session_id": "conv-b"}},
        {"extra_headers": {"x-ctxengine-session": "named-c"}},
        {},
    ]
    for extra in ways:
        await litellm.acompletion(model=MODEL, api_base=up.openai_base_url, api_key="sk-upstream", messages=opening, tools=[READ], **extra)
    await asyncio.sleep(0.5)
    hook.close()
    store = SqliteStore(work / "naming.db")
    return sorted(s.id for s in store.list_sessions())


async def _retry(work: Path, opening: list[dict[str, Any]]) -> dict[str, Any]:
    """One call planned twice (LiteLLM retries it, or falls back): the second is not kept
    waiting for the first's after-work, which never comes."""
    hook = _hook(work, "retry")
    kwargs = {"model": MODEL, "messages": opening, "tools": [READ], "litellm_call_id": "one-call"}
    started = time.perf_counter()
    for _ in range(2):
        await hook.async_pre_call_deployment_hook(dict(kwargs), "acompletion")
    seconds = time.perf_counter() - started
    hook.close()
    return {"seconds": seconds, "failed": hook.failed}


def _stats(up: StrictUpstream) -> dict[str, Any]:
    s = up.stats
    return {"finished": s["finished"], "requests": s["requests"], "rejected": dict(s["rejected"]), "over_window": s["over_window"], "max_tokens_seen": s["max_tokens_seen"]}


async def main(work: Path) -> dict[str, Any]:
    task = Task(work / "ws", steps=8)
    task.write()
    out: dict[str, Any] = {}
    with StrictUpstream(task, window=WINDOW) as up:
        hook = _hook(work, "sdk")
        litellm.callbacks = [hook]  # the one line
        history = await _task(up, task)
        await asyncio.sleep(0.5)  # the last turn's store write runs after the response
        hook.close()
        store = SqliteStore(work / "sdk.db")
        sessions = [s.id for s in store.list_sessions()]
        originals = json.dumps([store.originals(s) for s in sessions])
        out["sdk"] = {**_stats(up), "failed": hook.failed, "sessions": sessions, "markers": [f"MARKER part{i:02d}" in originals for i in range(1, task.steps + 1)], "client_tokens": count_request_tokens({"messages": history[:-1], "tools": [READ]})}

        out["naming"] = await _naming(up, work, history[:3])
        out["retry"] = await _retry(work, history[:3])

        over = history[:-1]  # the whole task's history: over the window
        for name in ("capped", "unchanged"):
            up.reset()
            hook = _hook(work, name)

            async def broken(*args: Any, **kwargs: Any) -> Any:
                raise RuntimeError("planning broke")

            hook.proxy._planned = broken  # type: ignore[method-assign]
            if name == "unchanged":
                hook.proxy._plan_capped = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("cap broke"))  # type: ignore[method-assign]
            litellm.callbacks = [hook]
            try:
                r = await litellm.acompletion(model=MODEL, api_base=up.openai_base_url, api_key="sk-upstream", messages=over, tools=[READ])
                ok = bool(r.choices)
            except Exception as exc:  # the upstream may reject an unchanged request over the window
                ok = f"{type(exc).__name__}"  # type: ignore[assignment]
            metric = hook.proxy.metrics.fail_open.labels("openai", "prepare")._value.get()
            out[name] = {**_stats(up), "ok": ok, "failed": hook.failed, "fail_open_metric": metric}
            hook.close()
    out["client_over_tokens"] = count_request_tokens({"messages": over, "tools": [READ]})
    return out


async def shadow_main(work: Path) -> dict[str, Any]:
    """The shadow check alone, in a process of its own (LiteLLM keeps the log callbacks of the
    hooks registered before, so a hook swapped in later does not get its calls' log events)."""
    task = Task(work / "ws", steps=8)
    task.write()
    history: list[dict[str, Any]] = [{"role": "user", "content": task.prompt}]
    for i in range(1, task.steps + 1):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"path": str(task.path(i))})}}
        history += [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": f"c{i}", "content": task.path(i).read_text()}]
    with StrictUpstream(task, window=WINDOW) as up:
        return {"shadow": await _shadow(up, work, history)}


if __name__ == "__main__":
    run = shadow_main if sys.argv[2:] == ["shadow"] else main
    print(json.dumps(asyncio.run(run(Path(sys.argv[1])))))
