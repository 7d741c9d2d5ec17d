"""The thread count: as configured, else the faster of the candidates, measured."""

from __future__ import annotations

import torch

from completion_engine import threads


def test_the_configured_count_wins_without_measuring(monkeypatch):
    monkeypatch.setenv("SPEC_COMPLETE_THREADS", "1")
    calls = []
    assert threads.choose_threads(lambda: calls.append(torch.get_num_threads())) == 1
    assert calls == [] and torch.get_num_threads() == 1


def test_unconfigured_picks_the_candidate_whose_step_is_fastest(monkeypatch):
    monkeypatch.delenv("SPEC_COMPLETE_THREADS", raising=False)
    monkeypatch.setattr(threads, "candidate_threads", lambda: [1, 2])
    clock = iter(range(1000))
    # a fake clock: with 2 threads each step takes 1 tick, with 1 thread 5 ticks
    now = {"t": 0.0}
    monkeypatch.setattr(threads.time, "perf_counter", lambda: now["t"])

    def step() -> None:
        next(clock)
        now["t"] += 1.0 if torch.get_num_threads() == 2 else 5.0

    try:
        assert threads.choose_threads(step) == 2
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)


def test_candidates_are_one_and_every_available_core():
    found = threads.candidate_threads()
    assert found[0] == 1 and found == sorted(set(found)) and len(found) <= 2


def test_one_thread_wins_unless_more_are_clearly_faster(monkeypatch):
    monkeypatch.setattr(threads, "candidate_threads", lambda: [1, 2])
    now = {"t": 0.0}
    monkeypatch.setattr(threads.time, "perf_counter", lambda: now["t"])

    def step() -> None:  # two threads only 10% faster: not worth the spin-waiting risk
        now["t"] += 1.0 if torch.get_num_threads() == 2 else 1.1

    try:
        assert threads.fastest_threads(step, [1, 2])[0] == 1
    finally:
        torch.set_num_threads(1)
