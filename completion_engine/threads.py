"""How many CPU threads torch runs on: as configured, else the faster of one and all cores, measured.

Why measure: on an idle 2-core machine two threads decode faster than one, but when the cores are
shared (the editor, a language server's own threads, another job) OpenMP's spin-waiting makes two
threads slower than one, sometimes many times slower (README, "Threads"). Which case holds is a
property of the machine as it is, so the engine times a few decode steps both ways when it loads.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

import torch

logger = logging.getLogger(__name__)

TRIALS = 3  # timed steps per candidate; the fastest counts
# More threads must beat one by this factor: when the cores are shared, one thread slows down
# gracefully (it waits its turn) but several spin-wait, and a step can take 4x longer (seen here
# in a benchmark when another job started after the choice was made).
MARGIN = 1.25


def configured_threads() -> int | None:
    """SPEC_COMPLETE_THREADS (which `--threads` sets), or None when the engine should choose."""
    value = os.environ.get("SPEC_COMPLETE_THREADS")
    return int(value) if value else None


def candidate_threads() -> list[int]:
    """One thread and every core this process may run on (one candidate on a 1-core machine)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return sorted({1, max(cores, 1)})


def fastest_threads(step: Callable[[], None], candidates: list[int]) -> tuple[int, dict[int, float]]:
    """Time `step` at each thread count (after one warm-up run each); return the choice and the timings.

    The choice is the fastest count, unless it beats one thread by less than MARGIN: then one.
    """
    timings = {}
    for threads in candidates:
        torch.set_num_threads(threads)
        step()
        best = float("inf")
        for _ in range(TRIALS):
            started = time.perf_counter()
            step()
            best = min(best, time.perf_counter() - started)
        timings[threads] = best
    fastest = min(timings, key=timings.__getitem__)
    if 1 in timings and timings[fastest] * MARGIN > timings[1]:
        fastest = 1
    return fastest, timings


def choose_threads(step: Callable[[], None]) -> int:
    """Set torch's thread count: the configured one, else the fastest for `step`; return it."""
    threads = configured_threads()
    if threads is None:
        candidates = candidate_threads()
        if len(candidates) == 1:
            threads = candidates[0]
        else:
            threads, timings = fastest_threads(step, candidates)
            logger.info(
                "torch threads: %d (one decode step: %s)",
                threads,
                ", ".join(f"{t} threads {s * 1e3:.0f} ms" for t, s in timings.items()),
            )
    torch.set_num_threads(threads)
    return threads
