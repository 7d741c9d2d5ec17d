"""Where a decode step's time goes, per draft method: timers around the engine's calls in the loop.

    python -m eval.bench_step_parts --package email --points 10 --repeats 2 --threads 2

The embedded target with its shipped draft completes the repo suite's points in a standard-library
package (its files open as documents, as in `bench`), the methods taking turns case by case. Every
call of the parts below is timed where it runs and put to the method whose completion made it. Per
method, over all runs: decode tok/s, tokens a verify step and each part's ms a step ("rest": the
loop's own time, the decode time less the parts). A second table splits the steps by what was
verified (no draft, the draft model's, an n-gram match's length class): steps, rows, accepted drafted
tokens and the verify's ms a step; n-gram kinds are the budget's match-length classes (ngram/0: a
match shorter than 3 tokens, /1: 3-4, /2: 5-7, /3: 8 or more). A timer adds about a microsecond a
call.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

# part -> the attributes it times: "engine." the engine, "loop." its module's functions, "runner." the
# target runner, "budget." the draft budget, "model." the draft model's drafter, "ngram." the n-gram one
PARTS: dict[str, tuple[str, ...]] = {
    "verify forward, chain": ("runner.extend",),
    "verify forward, tree": ("runner.verify_tree",),
    "drafting: draft model": ("model.propose",),
    "drafting: n-gram look-up": ("ngram.propose",),
    "greedy choice": ("loop.greedy_accept", "loop.greedy_accept_tree"),
    "keeping the path": ("runner.accept_path", "runner.truncate"),
    "streaming, stop checks": ("engine._accept",),
    "draft budget": (
        "budget.at_context",
        "budget.trim",
        "budget.observe",
        "budget.observe_step",
    ),
}


@dataclass
class PartTimers:
    """Seconds and calls per (method, part); `method` names whose calls these are now."""

    method: str = ""
    seconds: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    calls: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    _restore: list[tuple[object, str, object]] = field(default_factory=list)

    def wrap(self, owner: object, name: str, part: str) -> None:
        """Time every call of owner.name as `part` until restore()."""
        original = getattr(owner, name)
        self._restore.append((owner, name, owner.__dict__.get(name) if hasattr(owner, "__dict__") else None))

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                key = (self.method, part)
                self.seconds[key] += time.perf_counter() - started
                self.calls[key] += 1

        setattr(owner, name, timed)

    def restore(self) -> None:
        for owner, name, before in reversed(self._restore):
            if before is None:
                delattr(owner, name)
            else:
                setattr(owner, name, before)
        self._restore.clear()


@dataclass
class StepRecords:
    """One record a verify step: (method, what was verified, rows, accepted drafted tokens, seconds)."""

    method: str = ""
    steps: list[list] = field(default_factory=list)

    def on_step(self, rows: int, seconds: float) -> None:
        self.steps.append([self.method, "no draft", rows, 0, seconds])

    def on_drafted(self, kind: str, accepted: int) -> None:
        """The step just recorded verified a draft of this kind (the engine says so after the step)."""
        self.steps[-1][1], self.steps[-1][3] = kind, accepted


def attach(engine, timers: PartTimers, records: StepRecords) -> None:
    """Time the engine's parts (PARTS) and record its steps, both into the current method."""
    import completion_engine.engine as engine_module
    from completion_engine.draft_budget import draft_kind

    owners = {
        "runner": engine.target_runner,
        "budget": engine.budget,
        "model": engine._model_drafter,
        "ngram": engine._ngram,
        "loop": engine_module,
        "engine": engine,
    }
    for part, attributes in PARTS.items():
        for attribute in attributes:
            owner, name = attribute.split(".")
            if owners[owner] is not None:
                timers.wrap(owners[owner], name, part)
    step, observe = engine.budget.observe_step, engine.budget.observe  # the timed ones

    def observe_step(rows: int, seconds: float) -> None:
        records.on_step(rows, seconds)
        step(rows, seconds)

    def observed(draft, drafted: int, accepted: int) -> None:
        records.on_drafted(draft_kind(draft), accepted)
        observe(draft, drafted, accepted)

    engine.budget.observe_step, engine.budget.observe = observe_step, observed


def parts_table(timers: PartTimers, totals: dict[str, list[float]]) -> list[str]:
    """Markdown: per method tok/s, tokens a step and each part's ms a step. totals: method -> [decode
    seconds, tokens, verify steps]."""
    methods = list(totals)
    lines = ["| part, ms a step | " + " | ".join(f"`{m}`" for m in methods) + " |"]
    lines.append("|---" * (len(methods) + 1) + "|")
    per_step = {m: (totals[m][0] / totals[m][2] if totals[m][2] else 0.0) for m in methods}
    lines.append(
        "| decode tok/s | "
        + " | ".join(f"{t[1] / t[0]:.1f}" if t[0] else "-" for t in totals.values())
        + " |"
    )
    lines.append(
        "| tokens a step | "
        + " | ".join(f"{t[1] / t[2]:.2f}" if t[2] else "-" for t in totals.values())
        + " |"
    )
    for part in PARTS:
        cells = []
        for m in methods:
            seconds, calls = timers.seconds.get((m, part), 0.0), timers.calls.get((m, part), 0)
            steps = totals[m][2]
            cells.append(
                f"{seconds / steps * 1e3:.2f} ({calls / steps:.2f} calls)" if calls and steps else "-"
            )
        lines.append(f"| {part} | " + " | ".join(cells) + " |")
    rest = []
    for m in methods:
        steps = totals[m][2]
        timed = sum(timers.seconds.get((m, part), 0.0) for part in PARTS)
        rest.append(f"{(totals[m][0] - timed) / steps * 1e3:.2f}" if steps else "-")
    lines.append("| rest | " + " | ".join(rest) + " |")
    lines.append("| the whole step | " + " | ".join(f"{per_step[m] * 1e3:.2f}" for m in methods) + " |")
    return lines


def kinds_table(records: StepRecords) -> list[str]:
    """Markdown: per method and kind of step, steps, verify rows, accepted drafted tokens, verify ms."""
    groups: dict[tuple[str, str], list[list]] = defaultdict(list)
    for step in records.steps:
        groups[(step[0], step[1])].append(step)
    lines = [
        "| method | verified | steps | rows a step | accepted a step | verify ms a step |",
        "|---|---|---|---|---|---|",
    ]
    for (method, kind), steps in sorted(groups.items()):
        n = len(steps)
        rows, accepted, seconds = (sum(s[i] for s in steps) / n for i in (2, 3, 4))
        lines.append(f"| {method} | {kind} | {n} | {rows:.2f} | {accepted:.2f} | {seconds * 1e3:.2f} |")
    return lines


def run(engine, cases, methods: list[str], repeats: int, options, on_case: Callable[[], None]) -> tuple:
    """Every case's methods in turn (reversed on odd cases and repeats), timed by parts."""
    from completion_engine.completion import build_prompt, complete
    from eval.runner import case_cursor

    timers, records = PartTimers(), StepRecords()
    attach(engine, timers, records)
    totals: dict[str, list[float]] = {m: [0.0, 0, 0] for m in methods}
    opened: list[str] = []
    try:
        for index, case in enumerate(cases):
            for doc_id in opened:
                engine.remove_document(doc_id)
            opened = list(case.open_documents)
            for doc_id, text in case.open_documents.items():
                engine.set_document(doc_id, text)
            cursor = case_cursor(case)
            prompt = build_prompt(engine, cursor, options)
            for repeat in range(repeats):
                for method in methods if (index + repeat) % 2 == 0 else methods[::-1]:
                    engine.forget_outputs()  # no method drafts from what another wrote
                    timers.method = records.method = method
                    stats = complete(engine, cursor, replace(options, draft=method), prompt=prompt).stats
                    timers.method = records.method = ""
                    total = totals[method]
                    total[0] += stats.decode_s
                    total[1] += stats.tokens
                    total[2] += sum(stats.accepted_hist.values())
            on_case()
    finally:
        timers.restore()
    return timers, records, totals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", default="email", help="a standard-library package: the cases' files")
    parser.add_argument("--points", type=int, default=10, help="completion points")
    parser.add_argument("--repeats", type=int, default=2, help="runs per method and point")
    parser.add_argument("--methods", default="none,hybrid", help="draft methods, comma-separated")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-context", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)

    from tqdm import tqdm

    from completion_engine.config import EngineConfig
    from completion_engine.defaults import DEFAULT_TARGET, default_draft_model
    from completion_engine.engine import CompletionEngine
    from eval.cases import repo_cases
    from eval.options import eval_options, set_threads

    set_threads(args)
    methods = args.methods.split(",")
    config = EngineConfig(
        target=DEFAULT_TARGET, max_context=args.max_context, draft_model=default_draft_model(DEFAULT_TARGET)
    )
    engine = CompletionEngine.from_config(config, progress=False)
    for method in methods:
        engine.drafter_for(method)  # a bad method fails before any case runs
    root = Path(importlib.import_module(args.package).__file__).parent
    cases = repo_cases(root, args.points, 0, 4)
    progress = tqdm(total=len(cases), desc="step-parts", file=sys.stderr)
    timers, records, totals = run(engine, cases, methods, args.repeats, eval_options(args), progress.update)
    progress.close()
    print(
        f"{len(cases)} points in {args.package}, {args.max_new_tokens} new tokens, {args.repeats} runs each"
    )
    print("\n" + "\n".join(parts_table(timers, totals)))
    print("\n" + "\n".join(kinds_table(records)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
