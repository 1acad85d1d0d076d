"""The dashboard: savings, sessions and every compaction's audit, read from the session store
(:class:`Dashboard`; served at ``/ui`` by ``ctxengine proxy`` and alone by ``ctxengine ui``).
Needs the proxy extra (Starlette); :mod:`ctxengine.ui.data` alone needs only the store."""

from __future__ import annotations

__all__ = ["Dashboard"]


def __getattr__(name: str) -> object:
    if name == "Dashboard":
        from ctxengine.ui.app import Dashboard

        return Dashboard
    raise AttributeError(name)
