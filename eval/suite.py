"""Run a list of cases with a CaseRunner: progress bar, rows appended as they finish, resume.

Each finished case is appended to rows.jsonl at once, so an interrupted run loses at most the case
in flight; `resume` skips the case ids already there. meta.json records the settings that decide
the results, and a resume with different settings is refused rather than mixed in.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

from eval.cases import Case
from eval.report import append_row, read_rows
from eval.runner import CaseRunner

DEFAULT_OUT_ROOT = Path("eval") / "out"
# settings that change the rows; others (threads, progress) may differ on resume
RESULT_SETTINGS = (
    "suite",
    "target",
    "draft_model",
    "dtype",
    "exact",
    "methods",
    "max_new_tokens",
    "repeats",
    "max_draft",
    "row_cost",
    "draft_cost",
    "max_context",
    "seed",
    "root",
    "peers",
)


class ResumeError(Exception):
    pass


def out_folder(suite: str, out: str | None, resume: bool) -> Path:
    """--out, or eval/out/<suite>-<timestamp>; on resume without --out, the latest such folder."""
    if out:
        return Path(out)
    if resume:
        earlier = sorted(DEFAULT_OUT_ROOT.glob(f"{suite}-*"))
        if not earlier:
            raise ResumeError(f"nothing to resume: no {DEFAULT_OUT_ROOT}/{suite}-* folder; pass --out")
        return earlier[-1]
    return DEFAULT_OUT_ROOT / f"{suite}-{time.strftime('%Y%m%d-%H%M%S')}"


def prepare_folder(folder: Path, meta: dict, resume: bool) -> None:
    """Create the folder and meta.json; on resume check the settings match the earlier run's."""
    folder.mkdir(parents=True, exist_ok=True)
    meta_path, rows_path = folder / "meta.json", folder / "rows.jsonl"
    if resume and meta_path.exists():
        earlier = json.loads(meta_path.read_text())
        changed = [k for k in RESULT_SETTINGS if earlier.get(k) != meta.get(k)]
        if changed:
            details = ", ".join(f"{k}: {earlier.get(k)!r} -> {meta.get(k)!r}" for k in changed)
            raise ResumeError(f"cannot resume {folder}: settings changed ({details})")
    elif rows_path.exists() and rows_path.stat().st_size and not resume:
        raise ResumeError(f"{folder} already holds results; pass --resume to continue it, or another --out")
    meta_path.write_text(json.dumps(meta, indent=1))


def run_cases(
    cases: list[Case],
    runner: CaseRunner,
    folder: Path,
    resume: bool,
    progress: bool = True,
    desc: str = "cases",
) -> list[dict]:
    """Run the cases not yet in folder/rows.jsonl; return the rows of `cases`, in their order."""
    rows_path = folder / "rows.jsonl"
    done = read_rows(rows_path) if resume else []
    if resume:  # rewrite without a line an interruption may have cut short
        rows_path.write_text("".join(json.dumps(row) + "\n" for row in done))
    elif rows_path.exists():
        rows_path.unlink()
    done_ids = {row["case_id"] for row in done}
    todo = [case for case in cases if case.case_id not in done_ids]
    if resume and done_ids:
        print(f"resuming {folder}: {len(done_ids)} cases done, {len(todo)} to run", file=sys.stderr)
    from tqdm import tqdm

    for case in tqdm(todo, desc=desc, unit="case", disable=not progress, file=sys.stderr):
        append_row(rows_path, runner.run(case))
    by_id = {row["case_id"]: row for row in read_rows(rows_path)}
    return [by_id[case.case_id] for case in cases if case.case_id in by_id]


def machine_meta() -> dict:
    import torch
    import transformers

    return {
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
