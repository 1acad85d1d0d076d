"""Entry point of the ``ctxengine`` command.

Subcommands live in ``cmd_*.py`` modules of this package, each exporting ``COMMANDS`` (a list
of click commands); they are imported only when the CLI runs, so ``import ctxengine`` never
pulls in click. Library errors become one clear line on stderr and exit code 2.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
import sys
from typing import Any

import click

from ctxengine.errors import CtxEngineError
from ctxengine.redact import RedactingFilter, redact
from ctxengine.textsafe import clean

EXIT_USAGE = 2


class _Group(click.Group):
    """Turns ctxengine errors into one line and exit code 2 instead of a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CtxEngineError as exc:
            click.echo(f"ctxengine: error: {clean(redact(str(exc)))}", err=True)
            ctx.exit(EXIT_USAGE)
        except RecursionError:  # backstop: input nested deeper than some reader allows
            click.echo("ctxengine: error: input nested too deeply to process", err=True)
            ctx.exit(EXIT_USAGE)
        except BrokenPipeError:  # e.g. `ctxengine compact f.json | head`
            sys.stderr.close()
            ctx.exit(0)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ctxengine")
@click.option("-v", "--verbose", count=True, help="More logging (-vv for debug).")
def cli(verbose: int) -> None:
    """Keep an LLM agent's conversation inside its context window."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:  # no secret in a log line (see ctxengine.redact)
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())


def _load_commands() -> None:
    import ctxengine.cli as pkg

    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        if not info.name.startswith("cmd_"):
            continue
        module = importlib.import_module(f"ctxengine.cli.{info.name}")
        for command in getattr(module, "COMMANDS", []):
            cli.add_command(command)


_load_commands()


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="ctxengine")


if __name__ == "__main__":  # pragma: no cover
    main()
