"""The server's counters, as `specComplete/stats` returns them (the VS Code extension reads these names).

Counters are totals over all clients; per-request details ("recent", with document URIs) are kept
per client, so one client never sees another's documents.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from completion_engine.types import Stats

RECENT_REQUESTS = 32  # per-request stats kept for each client's stats request
TTFT_SAMPLES = 1024


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile; None for no values.

    >>> percentile([0.3, 0.1, 0.2], 0.5)
    0.2
    """
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, int(-(-q * len(ordered) // 1)) - 1))
    return ordered[rank]


@dataclass(slots=True)
class _Totals:
    requests: int = 0
    cancelled: int = 0
    busy: int = 0  # requests refused because the queue was full
    errors: int = 0
    limits: dict[str, int] = field(default_factory=dict)  # refusals by a per-client limit, by limit
    tokens: int = 0
    target_forwards: int = 0
    prefill_tokens: int = 0
    tree_steps: int = 0  # verify steps that checked a token tree
    tree_nodes: int = 0  # drafted tokens in those trees
    generation_s: float = 0.0
    warmups: int = 0  # background prefills run while the user typed or read
    warmups_cancelled: int = 0  # of them, cut short by a request
    warm_tokens: int = 0  # context tokens they computed
    drafted: dict[str, int] = field(default_factory=dict)
    accepted: dict[str, int] = field(default_factory=dict)
    # the same tokens by where each came from: context, documents, outputs (earlier completions), model
    by_origin: dict[str, list[int]] = field(default_factory=dict)  # origin -> [drafted, accepted]
    cache_hits: int = 0  # completions answered from earlier ones (typed through, undo/redo), no model call
    prefetches: int = 0  # completions started after an accept, before the editor asked
    prefetches_cancelled: int = 0  # of them, cut short by another edit


@dataclass(slots=True)
class _Tally:
    """What the editor reported about the suggestions of one group (all, one draft method, one language)."""

    shown: int = 0
    accepted: int = 0  # wholly
    partially_accepted: int = 0  # suggestions accepted in part (a word, a line) and not wholly
    partially_accepted_chars: int = 0

    def as_dict(self) -> dict:
        return {
            "shown": self.shown,
            "accepted": self.accepted,
            "partially_accepted": self.partially_accepted,
            "partially_accepted_chars": self.partially_accepted_chars,
            "accept_rate": round(self.accepted / self.shown, 4) if self.shown else None,
        }


class ServerCounters:
    """Thread-safe totals over every request the server has seen."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals = _Totals()
        self._ttft: deque[float] = deque(maxlen=TTFT_SAMPLES)
        self._suggestions = _Tally()
        self._by_draft: dict[str, _Tally] = {}
        self._by_language: dict[str, _Tally] = {}

    def count(self, what: str) -> None:
        """Add one to "requests", "cancelled", "busy", "errors", "cache_hits", "prefetches" or
        "prefetches_cancelled"."""
        with self._lock:
            setattr(self._totals, what, getattr(self._totals, what) + 1)

    def count_warmup(self, computed: int, cancelled: bool) -> None:
        with self._lock:
            self._totals.warmups += 1
            self._totals.warmups_cancelled += int(cancelled)
            self._totals.warm_tokens += computed

    def count_limit(self, name: str) -> None:
        """A per-client limit refused something (see DocumentStore)."""
        with self._lock:
            self._totals.limits[name] = self._totals.limits.get(name, 0) + 1

    def count_suggestion(self, event: str, draft: str, language_id: str, chars: int = 0) -> None:
        """The editor reported a suggestion `event` ("shown", "accepted", "partially_accepted"; a
        partial accept may add `chars` to a suggestion already counted, with event "")."""
        with self._lock:
            for group in (
                self._suggestions,
                self._by_draft.setdefault(draft, _Tally()),
                self._by_language.setdefault(language_id or "unknown", _Tally()),
            ):
                if event:
                    setattr(group, event, getattr(group, event) + 1)
                group.partially_accepted_chars += chars

    def record(self, stats: Stats, uri: str, cancelled: bool, user_facing: bool = True) -> None:
        """Add one generation's engine stats (`uri` is not kept here: see RecentRequests).

        A prefetch (not user_facing) adds its work but no TTFT sample: nobody waited for its first token.
        """
        with self._lock:
            t = self._totals
            t.tokens += stats.tokens
            t.target_forwards += stats.target_forwards
            t.prefill_tokens += stats.prefill_tokens
            t.tree_steps += stats.tree_steps
            t.tree_nodes += stats.tree_nodes
            t.generation_s += stats.wall_s
            for name, source in stats.by_source.items():
                t.drafted[name] = t.drafted.get(name, 0) + source.drafted
                t.accepted[name] = t.accepted.get(name, 0) + source.accepted
            for name, origin in stats.by_origin.items():
                counts = t.by_origin.setdefault(name, [0, 0])
                counts[0] += origin.drafted
                counts[1] += origin.accepted
            if stats.tokens and not cancelled and user_facing:
                self._ttft.append(stats.ttft_s)

    def snapshot(self, extra: dict | None = None) -> dict:
        with self._lock:
            t = self._totals
            ttft = list(self._ttft)
            acceptance = {
                name: (t.accepted.get(name, 0) / t.drafted[name] if t.drafted.get(name) else None)
                for name in ("ngram", "model")
            }
            return {
                "requests": t.requests,
                "cancelled": t.cancelled,
                "busy": t.busy,
                "errors": t.errors,
                "limits": dict(t.limits),
                "tokens": t.tokens,
                "target_forwards": t.target_forwards,
                "prefill_tokens": t.prefill_tokens,
                "tree_steps": t.tree_steps,
                "mean_tree_nodes": round(t.tree_nodes / t.tree_steps, 2) if t.tree_steps else None,
                "warmups": t.warmups,
                "warmups_cancelled": t.warmups_cancelled,
                "warm_tokens": t.warm_tokens,
                "cache_hits": t.cache_hits,
                "prefetches": t.prefetches,
                "prefetches_cancelled": t.prefetches_cancelled,
                "acceptance": acceptance,
                "by_origin": {
                    name: {"drafted": d, "accepted": a, "acceptance": round(a / d, 4) if d else None}
                    for name, (d, a) in sorted(t.by_origin.items())
                },
                "suggestions": {
                    **self._suggestions.as_dict(),
                    "by_draft": {name: tally.as_dict() for name, tally in sorted(self._by_draft.items())},
                    "by_language": {
                        name: tally.as_dict() for name, tally in sorted(self._by_language.items())
                    },
                },
                "ttft_p50_s": _round(percentile(ttft, 0.5)),
                "ttft_p95_s": _round(percentile(ttft, 0.95)),
                "tokens_per_s": round(t.tokens / t.generation_s, 2) if t.generation_s > 0 else None,
                **(extra or {}),
            }


class RecentRequests:
    """One client's latest requests with their engine stats; written from the worker thread."""

    def __init__(self, size: int = RECENT_REQUESTS) -> None:
        self._entries: deque[dict] = deque(maxlen=size)  # deque.append is atomic: no lock needed

    def add(self, uri: str, stats: Stats, kind: str = "model") -> None:
        """kind: "model" (a request the model ran), "prefetch" (run after an accept) or "cache"
        (answered from an earlier completion: its ttft_s is the server's time to answer)."""
        self._entries.append({"uri": uri, "kind": kind, **stats.as_dict()})

    def snapshot(self) -> list[dict]:
        return list(self._entries)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
