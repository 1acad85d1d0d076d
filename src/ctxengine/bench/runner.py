"""The benchmark loop: recorded sessions through engines, with caching and cost simulated.

:func:`run_bench` replays every session through every engine, session by session
(:func:`ctxengine.bench.session.run_session` replays one: the agent loop, the compacting turns
timed, the request billed and the facts looked up) and sums the runs
(:mod:`ctxengine.bench.results`: what ``--json`` writes). The names the bench used to define
here are still importable from this module.
"""

from __future__ import annotations

import json
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ctxengine.bench.baselines import HermesBaseline, MaskingBaseline, NoCompaction
from ctxengine.bench.results import BenchResult, EngineTotals, SessionRun, max_consecutive
from ctxengine.bench.session import Placement, RegisteredEngine, run_session, session_facts
from ctxengine.bench.uses import session_uses
from ctxengine.caching import default_placement
from ctxengine.config import Config
from ctxengine.engine import ContextEngine
from ctxengine.errors import ConfigError
from ctxengine.io import Session
from ctxengine.manager import default_store
from ctxengine.messages import tool_name
from ctxengine.models import ModelProfile, UnknownModelWarning, resolve_model
from ctxengine.registry import EngineRegistry

__all__ = [
    "BASELINES",
    "DEFAULT",
    "BenchResult",
    "EngineTotals",
    "RegisteredEngine",
    "SessionRun",
    "engine_retrievable",
    "make_engine_factory",
    "max_consecutive",
    "run_bench",
    "run_session",
    "session_facts",
]

DEFAULT = "default"
"""The pseudo engine name of what a new user gets: the configured engine (``compressor`` unless
the config says otherwise) with the manager's default cache placement, whatever ``placement``
the other engines of the run use."""

BASELINES: dict[str, Callable[[int], ContextEngine]] = {
    "none": lambda n: NoCompaction(context_length=n),
    "mask10": lambda n: MaskingBaseline(context_length=n, keep=10),
    # optional (never in the default set): Hermes Agent's own compressor, from its PyPI package
    "hermes": lambda n: HermesBaseline(context_length=n),
}


def make_engine_factory(
    name: str,
    config: Config,
    context_length: int,
    registry: EngineRegistry | None = None,
    **services: Any,
) -> Callable[[], ContextEngine]:
    """A factory building a fresh engine ``name`` (a baseline, or any registered engine);
    ``services`` (``store=``) go to engines that accept them."""
    if name in BASELINES:
        base = BASELINES[name]
        return lambda: base(context_length)
    reg = registry or EngineRegistry(plugin_dirs=config.plugins.dirs, entry_points=config.plugins.entry_points)
    reg.create(name, config, context_length=context_length, **services)  # fail early on unknown names
    return RegisteredEngine(name, config, context_length, reg, dict(services))


def engine_retrievable(engine: ContextEngine) -> Callable[[str], bool] | None:
    """How to ask ``engine`` alone whether a fact is retrievable verbatim, or ``None``.

    An engine that overrides :meth:`ContextEngine.retrievable` answers itself; otherwise an
    ``lcm_grep`` or ``ctx_grep`` tool of the engine is called with the fact as query and the
    fact must appear in its answer. (The bench asks the manager, whose store-backed recall
    answers for every engine: :meth:`ctxengine.ContextManager.retrievable`.)
    """
    if type(engine).retrievable is not ContextEngine.retrievable:
        return lambda text: bool(engine.retrievable(text))
    names = {tool_name(s) for s in engine.get_tool_schemas()}
    for tool in ("lcm_grep", "ctx_grep"):
        if tool in names:

            def grep(text: str, tool: str = tool) -> bool:
                try:
                    answer = engine.handle_tool_call(tool, {"query": text})
                except Exception:
                    return False
                if text in answer:
                    return True
                try:
                    decoded = json.dumps(json.loads(answer), ensure_ascii=False)
                except ValueError:
                    return False
                return text in decoded or json.dumps(text, ensure_ascii=False)[1:-1] in decoded

            return grep
    return None


def _profile(name: str, overrides: Mapping[str, Mapping[str, Any]] | None = None) -> ModelProfile:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnknownModelWarning)
        return resolve_model(name, overrides=overrides)


def run_bench(
    sessions: Sequence[Session],
    engines: Sequence[str],
    *,
    config: Config | None = None,
    context_length: int = 128_000,
    anthropic_model: str = "claude-sonnet-4.5",
    openai_model: str = "gpt-4o",
    placement: Placement = "system_and_3",
    registry: EngineRegistry | None = None,
    progress: Callable[[str], None] | None = None,
    pause: float = 0.0,
) -> BenchResult:
    """Replay every session through every engine; the ``none`` baseline is always included so
    costs can be given relative to it. ``pause``: seconds a person pauses between the tasks of
    a composed session (:func:`run_session`)."""
    cfg = config or Config()
    names = list(dict.fromkeys(["none", *engines]))
    amodel = _profile(anthropic_model, cfg.models)
    omodel = _profile(openai_model, cfg.models)
    for given, prof in ((anthropic_model, amodel), (openai_model, omodel)):
        if prof.input <= 0:
            raise ConfigError(f"model {given!r} has no input price in the model table; choose a priced model or add models.{given}.input to the config")
    with tempfile.TemporaryDirectory(prefix="ctxengine-bench-") as tmp:
        # a throwaway store for building each engine once up front (an unknown name fails
        # early; lcm needs a store); in the replay each session's manager builds its engine
        # with the session's own store, as a user's does (RegisteredEngine)
        store = default_store(cfg.with_overrides(store={"enabled": True, "backend": "sqlite", "path": str(Path(tmp) / "bench.db")}))
        services: dict[str, Any] = {"store": store} if store is not None else {}
        try:
            return _run(sessions, names, cfg, context_length, amodel, omodel, placement, registry, services, progress, pause)
        finally:
            close = getattr(store, "close", None)
            if callable(close):
                close()


def _run(
    sessions: Sequence[Session],
    names: list[str],
    cfg: Config,
    context_length: int,
    amodel: ModelProfile,
    omodel: ModelProfile,
    placement: Placement,
    registry: EngineRegistry | None,
    services: dict[str, Any],
    progress: Callable[[str], None] | None,
    pause: float = 0.0,
) -> BenchResult:
    # each name runs as (engine, placement); ``default`` is the manager's defaults
    plan: dict[str, tuple[str, Placement]] = {}
    for n in names:
        plan[n] = (cfg.context.engine, default_placement()) if n == DEFAULT else (n, placement)
    factories = {e: make_engine_factory(e, cfg, context_length, registry, **services) for e in dict.fromkeys(e for e, _ in plan.values())}
    t0 = time.perf_counter()
    facts, uses = [session_facts(s) for s in sessions], [session_uses(s.messages) for s in sessions]
    result = BenchResult(context_length, placement, amodel.name, omodel.name, [s.id for s in sessions], {}, cache_ttl=cfg.cache_ttl, pause=pause)
    result.engines = {n: EngineTotals(n) for n in names}
    # a configuration listed under two names (``default`` and its engine) runs once
    runs_as: dict[str, str] = {}
    first: dict[tuple[str, Placement], str] = {}
    for n in names:
        engine, where = plan[n]
        if n == DEFAULT:
            result.labels[n] = f"{DEFAULT} ({engine}, {where})"
        runs_as[n] = first.setdefault((engine, where), n)
    # session by session, every engine in turn: a machine that gets busier during the run slows
    # every engine alike, so latency ratios (to the hermes baseline, say) stay fair
    for s, f, u in zip(sessions, facts, uses, strict=True):
        for n in names:
            if runs_as[n] != n:
                continue
            engine, where = plan[n]
            run = run_session(
                s,
                n,
                factories[engine],
                config=cfg,
                context_length=context_length,
                anthropic_model=amodel,
                openai_model=omodel,
                placement=where,
                session_id=f"bench:{n}:{s.id}",
                facts=f,
                pause=pause,
                uses=u,
            )
            result.engines[n].runs.append(run)
    for n in names:
        if runs_as[n] != n:
            result.engines[n] = EngineTotals(n, [replace(r, engine=n) for r in result.engines[runs_as[n]].runs])
    if progress is not None:
        for n, totals in result.engines.items():
            progress(f"{n}: {len(sessions)} sessions, {totals.calls} calls")
    result.elapsed_s = time.perf_counter() - t0
    return result
