"""``ctxengine hermes``: use ctxengine as Hermes Agent's context engine."""

from __future__ import annotations

from pathlib import Path

import click

from ctxengine.errors import ConfigError


@click.group()
def hermes() -> None:
    """Hermes Agent integration (the pip plugin needs no command: see the README)."""


@hermes.command("install-plugin")
@click.argument("plugins_dir", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Replace a directory ctxengine did not write.")
def install_plugin(plugins_dir: Path | None, force: bool) -> None:
    """Write the plugins/context_engine/ctxengine/ directory into PLUGINS_DIR (default: the
    plugins folder of the Hermes installed in this environment)."""
    from ctxengine.integrations.hermes.install import hermes_plugins_dir, write_plugin_dir

    target = plugins_dir or hermes_plugins_dir()
    if target is None:
        raise ConfigError("Hermes Agent is not installed in this environment; give its plugins directory: ctxengine hermes install-plugin DIR")
    written = write_plugin_dir(target, force=force)
    click.echo(f"wrote {written}")
    click.echo("select it in Hermes' config.yaml:  context: {engine: ctxengine}")


COMMANDS = [hermes]
