"""Worker threads reused for calls that run under a deadline (an engine's ``compress``).

A call under a deadline runs on another thread so that the caller can stop waiting when the
deadline passes. Starting a thread for each call costs a thread's creation and a handshake
with it before the call even begins; an idle worker is handed the call instead and the
caller waits for it alone. A worker whose call outlives its deadline keeps running it and
is not handed another one until it returns; a new worker is started when none is idle.

Not :class:`concurrent.futures.ThreadPoolExecutor`: its threads are joined when the
interpreter exits, so an engine hung past its deadline would keep the process from exiting,
and its fixed pool queues a new call behind hung ones; here workers are daemon threads and a
hung call never delays another.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from queue import SimpleQueue

__all__ = ["Running", "call_within"]

MAX_IDLE = 4
"""Idle workers kept for later calls; a worker finding this many idle ends."""


class Running:
    """One call handed to a worker: :meth:`is_alive` while it runs."""

    __slots__ = ("_done", "fn", "name")

    def __init__(self, fn: Callable[[], None], name: str) -> None:
        self.fn = fn
        self.name = name
        self._done = threading.Lock()
        self._done.acquire()

    def is_alive(self) -> bool:
        """True until the call has returned (or raised)."""
        return self._done.locked()

    def wait(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for the call; True when it has returned."""
        if self._done.acquire(timeout=max(0.0, timeout)):
            self._done.release()
            return True
        return False

    def finish(self) -> None:
        self._done.release()


class _Worker:
    """A daemon thread running the calls put in its queue, one at a time."""

    def __init__(self) -> None:
        self.jobs: SimpleQueue[Running] = SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="ctxengine-worker", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            job = self.jobs.get()
            self.thread.name = job.name
            try:
                job.fn()  # the call catches what it raises (BaseException included)
            finally:
                self.thread.name = "ctxengine-worker"
                job.finish()
            if not _park(self):
                return


_idle: list[_Worker] = []
_lock = threading.Lock()


def _park(worker: _Worker) -> bool:
    """Put ``worker`` back among the idle ones; False when enough are idle (it ends)."""
    with _lock:
        if len(_idle) >= MAX_IDLE:
            return False
        _idle.append(worker)
        return True


def _take() -> _Worker:
    with _lock:
        while _idle:
            worker = _idle.pop()
            if worker.thread.is_alive():
                return worker
    return _Worker()


def _forget_idle() -> None:  # pragma: no cover - runs in a forked child
    global _lock
    _lock = threading.Lock()
    _idle.clear()  # a forked child has none of its parent's threads


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_idle)


def call_within(fn: Callable[[], None], deadline: float, *, name: str) -> Running:
    """Run ``fn`` on a worker thread (named ``name`` meanwhile) and wait at most ``deadline``
    seconds for it: the returned call :meth:`~Running.is_alive` when the deadline passed first
    (its worker goes on running it). ``fn`` must not raise: it reports its outcome itself."""
    job = Running(fn, name)
    _take().jobs.put(job)
    job.wait(deadline)
    return job
