"""``python -m ctxengine``."""

from ctxengine.cli.main import main

main()
