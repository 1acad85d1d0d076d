"""Prometheus metrics of one proxy process (``GET /metrics``).

Each :class:`ProxyMetrics` has its own registry, so several proxies (tests, one process per
port) never share counters. Names follow Prometheus conventions (``_total`` counters,
``_seconds`` histograms).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE", "ProxyMetrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ProxyMetrics:
    """The counters and histograms the proxy updates (see each ``documentation`` string)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self.requests = Counter("ctxengine_proxy_requests", "Requests served, by API and outcome.", ["api", "outcome"], registry=r)
        self.tokens_in = Counter("ctxengine_proxy_tokens_in", "Estimated tokens of the conversations clients sent (before compaction).", ["api"], registry=r)
        self.tokens_out = Counter("ctxengine_proxy_tokens_out", "Estimated tokens of the conversations sent upstream (after compaction).", ["api"], registry=r)
        self.compactions = Counter("ctxengine_proxy_compactions", "Compactions run by the sessions' engines.", ["api"], registry=r)
        self.cache_read = Counter("ctxengine_proxy_upstream_cache_read_tokens", "Prompt tokens the upstream reported read from its cache.", ["api"], registry=r)
        self.cache_write = Counter("ctxengine_proxy_upstream_cache_write_tokens", "Prompt tokens the upstream reported written to its cache.", ["api"], registry=r)
        self.prompt_tokens = Counter("ctxengine_proxy_upstream_prompt_tokens", "Prompt tokens the upstream reported.", ["api"], registry=r)
        self.completion_tokens = Counter("ctxengine_proxy_upstream_completion_tokens", "Completion tokens the upstream reported.", ["api"], registry=r)
        self.tool_rounds = Counter("ctxengine_proxy_tool_rounds", "Extra upstream round trips made to answer the engine's own tools.", ["api"], registry=r)
        self.context_retries = Counter(
            "ctxengine_proxy_context_retries", "Requests the upstream rejected as over the model's window, compacted to the window it named and sent again.", ["api"], registry=r
        )
        self.idle_ended = Counter("ctxengine_proxy_idle_sessions_ended", "Sessions ended in memory after proxy.session_idle_seconds without a request.", registry=r)
        self.fail_open = Counter("ctxengine_proxy_fail_open", "Requests forwarded unchanged because context management failed.", ["api", "reason"], registry=r)
        self.added_latency = Histogram(
            "ctxengine_proxy_added_latency_seconds",
            "Time from receiving a request to sending it upstream (the proxy's own work).",
            ["api"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )

        self.stage = Histogram(
            "ctxengine_proxy_stage_seconds",
            "Time of each stage of a chat request: read (the body, from the first byte the app sees), "
            "parse, wait_settle (waiting for the session's previous request to finish its "
            "after-response work), open (a session new in this process opened in a worker thread: the store "
            "read and the engine's start, before its turn is planned inline), plan_inline (the manager's work, on the event loop: a quick turn), "
            "or plan_queue (waiting for a worker thread), plan (the manager's work there), plan_return "
            "(back on the event loop); upstream (sending it until the response, or its headers when "
            "streamed, is in); after the response: settle (usage to the manager and the turn's "
            "deferred store write, including the hand-over to a worker thread) and record (the write).",
            ["api", "stage"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.plans = Counter(
            "ctxengine_proxy_plans",
            "Chat requests planned, by where: inline (on the event loop, a quick turn) or worker (a worker thread); reloaded: sessions reloaded from the store first (another process served them).",
            ["api", "where"],
            registry=r,
        )
        self.gc_pause = Histogram(
            "ctxengine_proxy_gc_pause_seconds",
            "Pauses of the cyclic garbage collector, by generation (recorded by the proxy command).",
            ["generation"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )

    def child(self, metric: Counter | Histogram, *labels: str) -> Any:
        """``metric.labels(*labels)``, looked up once: the lookup (a lock, a tuple, a dict) costs
        as much as the update itself, and the request path makes a few of them."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def observe_stages(self, api: str, stages: list[tuple[str, float]]) -> None:
        """Observe ``(stage, seconds)`` pairs of one request in ``ctxengine_proxy_stage_seconds``."""
        for stage, seconds in stages:
            self.child(self.stage, api, stage).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
