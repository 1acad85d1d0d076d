"""``ctxengine bench``: replay recorded sessions through engines and compare cost and retention."""

from __future__ import annotations

from pathlib import Path

import click

from ctxengine.bench.data import (
    ENV_VAR,
    FETCH_COMMAND,
    find_data_dir,
    missing_data_message,
    trajectory_files,
)
from ctxengine.caching import default_placement
from ctxengine.config import load_config
from ctxengine.io import Session, read_sessions

DEFAULT_ENGINES = ("default", "mask10", "rules", "compressor", "lcm", "cacheaware")
"""``default`` is what a new user gets: the configured engine with the manager's default placement."""


@click.command()
@click.argument("files", nargs=-1, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--data", "data_dir", type=click.Path(file_okay=False, path_type=Path), default=None, help=f"Replay every *.jsonl file of this folder. With no FILE and no --data: ${ENV_VAR}, else ./data, else ../shared/data ({FETCH_COMMAND} downloads the published trajectories into data/).")
@click.option("--engine", "-e", "engines", multiple=True, help="Engine to run (repeatable). Default: 'default' (the manager's defaults), every built-in engine and the mask10 baseline; 'none' always runs; 'hermes' runs Hermes Agent's own compressor (hermes-agent from PyPI, in a cached venv built on first use).")
@click.option("--context-length", "-n", type=click.IntRange(min=1), default=128_000, show_default=True, help="Window the engines work against.")
@click.option("--compose", "compose_n", type=click.IntRange(min=1), default=1, show_default=True, help="Chain N trajectories of each file into one long session.")
@click.option("--model", default="claude-sonnet-4.5", show_default=True, help="Model whose Anthropic cache rules and price the cost uses.")
@click.option("--openai-model", default="gpt-4o", show_default=True, help="Model whose OpenAI automatic caching and price the cost uses.")
@click.option(
    "--placement",
    type=click.Choice(["auto", "system_and_3", "planner"]),
    default="auto",
    show_default=True,
    help="Where cache breakpoints go for the engines named (auto: the manager's default, planner). The 'default' row always uses the default.",
)
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=None, help="config.yaml for the engines' settings.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Write every measurement as JSON.")
@click.option("--chart", "chart_out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Write a chart: OUT.png or OUT.html.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Use only the first N sessions (after composing).")
@click.option("--pause", type=click.FloatRange(min=0), default=0.0, show_default=True, help="Seconds a person pauses between the tasks of a composed session (--compose): caches past their TTL go cold.")
@click.option("--cache-ttl", type=click.Choice(["5m", "1h", "auto"]), default=None, help="TTL of the cache markers for every engine (prompt_caching.cache_ttl; auto: 1h once a person paces the session). Default: the config's.")
def bench(
    files: tuple[Path, ...],
    data_dir: Path | None,
    engines: tuple[str, ...],
    context_length: int,
    compose_n: int,
    model: str,
    openai_model: str,
    placement: str,
    config_path: Path | None,
    json_out: Path | None,
    chart_out: Path | None,
    limit: int | None,
    pause: float,
    cache_ttl: str | None,
) -> None:
    """Replay the sessions in FILE... (or in the *.jsonl files of a data folder) through engines
    in a simulated agent loop and report input cost with and without prompt caching, peak
    context, compactions, latency, invalid and over-window requests, and retention of the
    preservation-guarantee facts."""
    from ctxengine.bench.compose import compose_sessions
    from ctxengine.bench.report import format_table, write_chart, write_json
    from ctxengine.bench.runner import run_bench

    config = load_config(config_path)
    if cache_ttl is not None:
        config = config.with_overrides(prompt_caching={"cache_ttl": cache_ttl})
    sessions: list[Session] = []
    for f in _inputs(files, data_dir):
        sessions.extend(compose_sessions(read_sessions(f), compose_n))
    if limit is not None:
        sessions = sessions[:limit]
    if not sessions:
        raise click.UsageError("no sessions to replay")
    names = list(engines) or list(DEFAULT_ENGINES)
    chosen = [n for n in names if n != "none"]
    if not engines:
        chosen = _available(chosen, config)
    result = run_bench(
        sessions,
        chosen,
        config=config,
        context_length=context_length,
        anthropic_model=model,
        openai_model=openai_model,
        placement=default_placement() if placement == "auto" else "planner" if placement == "planner" else "system_and_3",
        progress=lambda line: click.echo(line, err=True),
        pause=pause,
    )
    click.echo(format_table(result))
    if json_out is not None:
        write_json(result, json_out)
        click.echo(f"wrote {json_out}", err=True)
    if chart_out is not None:
        write_chart(result, chart_out)
        click.echo(f"wrote {chart_out}", err=True)


def _inputs(files: tuple[Path, ...], data_dir: Path | None) -> list[Path]:
    """FILE... and the trajectories of --data; with neither, those of the data folder found
    (a usage error naming every way to give some when there is none)."""
    if data_dir is not None:
        found = trajectory_files(data_dir)
        if not found:
            raise click.UsageError(f"--data {data_dir}: no *.jsonl trajectories in it. {missing_data_message()}")
        return [*files, *found]
    if files:
        for f in files:
            if not f.exists():
                raise click.UsageError(f"{f}: no such file. {missing_data_message()}")
        return list(files)
    folder = find_data_dir()
    if folder is None:
        raise click.UsageError(missing_data_message())
    click.echo(f"replaying the trajectories of {folder}", err=True)
    return trajectory_files(folder)


def _available(names: list[str], config: object) -> list[str]:
    """The default engines this installation knows (one missing is skipped with a note)."""
    from ctxengine.bench.runner import BASELINES, DEFAULT
    from ctxengine.config import Config
    from ctxengine.registry import EngineRegistry

    cfg = config if isinstance(config, Config) else Config()
    known = set(EngineRegistry(plugin_dirs=cfg.plugins.dirs, entry_points=cfg.plugins.entry_points).names())
    out = []
    for n in names:
        if n in BASELINES or n in known or n == DEFAULT:
            out.append(n)
        else:
            click.echo(f"skipping engine {n!r}: not available here", err=True)
    return out


COMMANDS = [bench]
