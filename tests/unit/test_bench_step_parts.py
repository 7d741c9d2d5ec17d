"""The step-parts benchmark's timers and tables, on a tiny random model."""

from completion_engine.completion import CompletionOptions
from completion_engine.config import EngineConfig
from completion_engine.engine import CompletionEngine
from eval.bench_step_parts import PARTS, PartTimers, kinds_table, parts_table, run
from eval.cases import BODY, Case

SOURCE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"


class Box:
    def twice(self, x: int) -> int:
        return 2 * x


def test_part_timers_count_calls_per_method_and_restore_what_they_wrapped():
    box, timers = Box(), PartTimers()
    timers.wrap(box, "twice", "doubling")
    timers.method = "a"
    assert box.twice(3) == 6 and box.twice(4) == 8
    timers.method = "b"
    box.twice(5)
    assert timers.calls[("a", "doubling")] == 2 and timers.calls[("b", "doubling")] == 1
    assert timers.seconds[("a", "doubling")] > 0.0
    timers.restore()
    assert "twice" not in vars(box) and box.twice(1) == 2  # the class's method again
    timers.wrap(box, "twice", "doubling")
    timers.restore()
    assert not timers._restore


def test_every_part_of_the_loop_is_timed_and_the_engine_is_left_as_it_was(tiny_target):
    engine = CompletionEngine(EngineConfig(target="tiny", max_draft=6), tiny_target)
    prefix = SOURCE + "\n\ndef mul(a, b):\n"
    case = Case(
        "m.py:5:0:body", BODY, prefix, "    return a * b\n", min_indent=4, open_documents={"o.py": SOURCE}
    )
    ticks = []
    timers, records, totals = run(
        engine, [case], ["none", "ngram"], 2, CompletionOptions(max_new_tokens=12), lambda: ticks.append(1)
    )
    assert ticks == [1]
    for method in ("none", "ngram"):
        decode_s, tokens, steps = totals[method]
        assert tokens > 0 and steps > 0 and decode_s > 0.0
        assert sum(1 for step in records.steps if step[0] == method) == steps  # a record a verify step
    assert timers.calls[("none", "verify forward, chain")] == totals["none"][2]  # one 1-row forward a step
    assert ("none", "drafting: n-gram look-up") not in timers.calls
    assert timers.calls[("ngram", "drafting: n-gram look-up")] > 0
    assert "_accept" not in vars(engine) and "extend" not in vars(engine.target_runner)
    assert "observe" not in vars(engine.budget) and "observe_step" not in vars(engine.budget)
    table = "\n".join(parts_table(timers, totals))
    assert all(f"| {part} |" in table for part in PARTS) and "| the whole step |" in table
    kinds = "\n".join(kinds_table(records))
    assert "| none | no draft |" in kinds
