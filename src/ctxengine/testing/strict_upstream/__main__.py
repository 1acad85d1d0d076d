"""``python -m ctxengine.testing.strict_upstream``."""

from . import main

main()
