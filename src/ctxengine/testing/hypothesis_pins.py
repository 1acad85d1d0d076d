"""Two pins on hypothesis' internals that make the contract kit's runs bounded and reproducible:
a limit on the time spent shrinking a failure, and no "local constants" in what is drawn."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import hypothesis.internal.conjecture.engine as _hypothesis_engine
import hypothesis.internal.conjecture.providers as _hypothesis_providers

__all__ = ["no_local_constants", "shrink_limit"]

@contextmanager
def shrink_limit(seconds: float) -> Iterator[None]:
    """Bound the time hypothesis spends shrinking a failure (five minutes by default, long when
    each example runs an engine over whole conversations). The limit is a module constant of
    hypothesis' engine; when a hypothesis version lacks it, its default applies."""
    name = "MAX_SHRINKING_SECONDS"
    old = getattr(_hypothesis_engine, name, None)
    if old is None:
        yield
        return
    setattr(_hypothesis_engine, name, seconds)
    try:
        yield
    finally:
        setattr(_hypothesis_engine, name, old)


@contextmanager
def no_local_constants() -> Iterator[None]:
    """Draw with no "local constants" while the kit runs, so a fixed seed gives the same
    conversations whatever ran before in the process.

    Hypothesis mixes into what it draws the literals of every module it counts as the user's
    own code that is imported so far (ctxengine's, a plugin's): a process-wide pool that grows
    as tests import more of the code, so the same seed gave other conversations alone than
    after other tests. The pool and its cache are hypothesis internals; when a version lacks
    them, its default applies.
    """
    get = getattr(_hypothesis_providers, "_get_local_constants", None)
    make = getattr(_hypothesis_providers, "Constants", None)
    cache = getattr(getattr(_hypothesis_providers, "CONSTANTS_CACHE", None), "cache", None)
    if get is None or make is None or cache is None or not hasattr(cache, "clear"):
        yield
        return
    empty = make()
    cache.clear()  # drawable constants computed with the pool as it was
    setattr(_hypothesis_providers, "_get_local_constants", lambda: empty)  # noqa: B010
    try:
        yield
    finally:
        setattr(_hypothesis_providers, "_get_local_constants", get)  # noqa: B010
        cache.clear()
