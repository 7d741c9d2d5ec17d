"""Repository-level completion: score a completion against the real code at the cursor."""

from __future__ import annotations

from eval.cases import Case
from eval.metrics import edit_similarity, first_line_exact_match, python_parses


def completed_file(case: Case, completion: str) -> str:
    """The file with the completion in place of the reference (which ends before a line break)."""
    return case.prefix + completion + case.suffix


def score_repo(case: Case, completion: str) -> dict:
    metrics = {
        "exact_match_first_line": first_line_exact_match(completion, case.reference),
        "edit_similarity": round(edit_similarity(completion, case.reference), 4),
    }
    if case.language == "python":
        metrics["syntax_valid"] = python_parses(completed_file(case, completion))
    return metrics
