"""Prometheus metrics of the front end, per replica: requests, queue length, TTFT, tokens/s, acceptance.

The registry is the server's own (not prometheus_client's global one), so a test process can build
several; `render()` is the text the /metrics endpoint returns.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from completion_engine.types import Stats

TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0)
TOKENS_PER_S_BUCKETS = (5, 10, 20, 40, 80, 160, 320, 640, 1280)


class ReplicaMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ["replica"]
        self.requests = Counter(
            "spec_complete_requests", "Completions answered", [*labels, "outcome"], registry=self.registry
        )
        self.queue_length = Gauge(
            "spec_complete_queue_length",
            "Requests sent to a replica and not answered",
            labels,
            registry=self.registry,
        )
        self.up = Gauge(
            "spec_complete_replica_up", "1 while the replica is routed to", labels, registry=self.registry
        )
        self.ttft = Histogram(
            "spec_complete_ttft_seconds",
            "Time to first token",
            labels,
            buckets=TTFT_BUCKETS_S,
            registry=self.registry,
        )
        self.tokens_per_s = Histogram(
            "spec_complete_tokens_per_second",
            "Decode speed of each completion",
            labels,
            buckets=TOKENS_PER_S_BUCKETS,
            registry=self.registry,
        )
        self.drafted = Counter(
            "spec_complete_drafted_tokens",
            "Draft tokens proposed",
            [*labels, "source"],
            registry=self.registry,
        )
        self.accepted = Counter(
            "spec_complete_accepted_tokens",
            "Draft tokens accepted (acceptance = accepted / drafted)",
            [*labels, "source"],
            registry=self.registry,
        )

    def queue(self, replica: str, outstanding: int) -> None:
        self.queue_length.labels(replica).set(outstanding)

    def healthy(self, replica: str, up: bool) -> None:
        self.up.labels(replica).set(1 if up else 0)

    def record(self, replica: str, stats: Stats, cancelled: bool) -> None:
        self.requests.labels(replica, "cancelled" if cancelled else "completed").inc()
        if stats.tokens and not cancelled:
            self.ttft.labels(replica).observe(stats.ttft_s)
            if stats.wall_s > 0:
                self.tokens_per_s.labels(replica).observe(stats.tokens / stats.wall_s)
        for source, counts in stats.by_source.items():
            self.drafted.labels(replica, source).inc(counts.drafted)
            self.accepted.labels(replica, source).inc(counts.accepted)

    def render(self) -> bytes:
        return generate_latest(self.registry)
