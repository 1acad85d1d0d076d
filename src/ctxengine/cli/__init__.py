"""The ``ctxengine`` command line (click). Nothing in the library imports this package."""
