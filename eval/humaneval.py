"""HumanEval: complete each problem's function body, then run its tests in the sandbox for pass@1."""

from __future__ import annotations

from eval.cases import Case, humaneval_program
from eval.sandbox import run_python


def score_humaneval(case: Case, completion: str, timeout_s: float = 10.0, memory_mb: int = 1024) -> dict:
    """Passed or not, from the tests run in a sandboxed subprocess (greedy: one sample, so pass@1)."""
    result = run_python(humaneval_program(case, completion), timeout_s=timeout_s, memory_mb=memory_mb)
    return {"passed": result.passed, "status": result.status, "isolation": result.isolation}
