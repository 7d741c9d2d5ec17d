"""The evaluation end to end on the tiny random model: a few cases per suite, well under a minute."""

import json
import subprocess
import sys

import pytest

from eval.cli import main

FILES = {
    "geometry.py": (
        "import math\n\n\n"
        "def area(radius):\n"
        '    """Area of a circle."""\n'
        "    squared = radius * radius\n"
        "    return math.pi * squared\n\n\n"
        "def perimeter(radius):\n"
        "    return 2 * math.pi * radius\n"
    ),
    "numbers.py": (
        "def clamp(value, low, high):\n"
        "    if value < low:\n"
        "        return low\n"
        "    return min(value, high)\n\n\n"
        "def mean(values):\n"
        "    total = sum(values)\n"
        "    return total / len(values)\n"
    ),
    "text.py": "def shout(word):\n    loud = word.upper()\n    return loud + '!'\n",
    "lists.py": "def first(items):\n    head = items[0]\n    return head\n",
}
TINY = ["--target", "tiny-random", "--threads", "1", "--max-context", "256", "--quiet"]


@pytest.fixture()
def package(tmp_path):
    root = tmp_path / "pkg"
    root.mkdir()
    for name, text in FILES.items():
        (root / name).write_text(text)
    return root


def test_repo_suite_writes_rows_summary_and_plots_and_resumes(package, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["repo", "--root", str(package), "--limit", "3", "--max-new-tokens", "8", "--out", str(out), *TINY]
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    rows = results["rows"]
    assert len(rows) == 3
    for row in rows:
        assert list(row["methods"]) == ["none", "ngram", "ngram-chain"]
        assert row["lossless"]["identical"]
        assert set(row["methods"]["none"]["metrics"]) == {
            "exact_match_first_line",
            "edit_similarity",
            "syntax_valid",
        }
        assert set(row["peers"]) == {"hf_plain", "hf_prompt_lookup", "hf_fp32_plain"}
        assert "equal_plain" in row["peers"]["hf_prompt_lookup"]
        assert row["edit_ttft_s"] > 0 and 0 <= row["edit_prefill_tokens"] < row["context_tokens"]
        assert row["peers"]["hf_fp32_plain"]["prefill_tokens_per_s"] > 0
    assert results["meta"]["notes"] == [
        "method 'model' skipped: needs a draft model (--draft-model)",
        "method 'hybrid' skipped: needs a draft model (--draft-model)",
    ]
    summary = (out / "summary.md").read_text()
    assert "every output of every draft method equals plain decoding's" in summary
    assert "| hf_prompt_lookup |" in summary and "| hf_fp32_plain |" in summary
    assert "edit TTFT s" in summary
    for plot in ("speedup.png", "accepted_lengths.png", "ttft.png"):
        assert (out / plot).stat().st_size > 0
    assert len((out / "rows.jsonl").read_text().splitlines()) == 3

    capsys.readouterr()
    assert main([*args, "--resume"]) == 0
    assert "3 cases done, 0 to run" in capsys.readouterr().err
    assert len((out / "rows.jsonl").read_text().splitlines()) == 3


def test_humaneval_suite_runs_the_tests_in_the_sandbox(tmp_path):
    out = tmp_path / "out"
    assert (
        main(["humaneval", "--limit", "2", "--max-new-tokens", "8", "--no-peers", "--out", str(out), *TINY])
        == 0
    )
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [row["case_id"] for row in rows] == ["HumanEval/0", "HumanEval/1"]
    for row in rows:
        metrics = row["methods"]["none"]["metrics"]
        assert metrics["status"] in {"passed", "failed", "timeout"}
        assert "peers" not in row
    assert "pass@1" in (out / "summary.md").read_text()


def test_bench_reports_methods_modes_and_dtypes(package, tmp_path):
    out = tmp_path / "bench"
    args = ["bench", "--root", str(package), "--points", "2", "--max-new-tokens", "6", "--no-plots"]
    assert main([*args, "--out", str(out), *TINY]) == 0
    text = (out / "bench.md").read_text()
    for peer in ("hf_plain", "hf_prompt_lookup", "hf_fp32_plain"):  # the speed table, same run
        assert f"| {peer} |" in text
    assert "prefill tok/s" in text and "edit TTFT s" in text
    assert ", KV cache " in text  # the main configuration's line says what its KV cache keeps
    for mode, dtype in [
        ("exact", "bfloat16"),
        ("inexact", "bfloat16"),
        ("exact", "float32"),
        ("inexact", "float32"),
    ]:
        assert f"| {mode} | {dtype} |" in text
        assert len((out / f"{mode}-{dtype}" / "rows.jsonl").read_text().splitlines()) == 2


def test_bad_arguments_are_reported_not_raised(tmp_path, capsys):
    assert main(["repo", "--root", str(tmp_path / "missing"), "--out", str(tmp_path / "o"), *TINY]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_python_m_eval_shows_its_suites():
    result = subprocess.run(
        [sys.executable, "-m", "eval", "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0
    assert "humaneval" in result.stdout and "repo" in result.stdout


def test_draft_model_methods_and_the_assisted_peer(package, tmp_path):
    out = tmp_path / "out"
    args = ["repo", "--root", str(package), "--limit", "1", "--max-new-tokens", "6", "--no-plots"]
    assert main([*args, "--draft-model", "tiny-random", "--out", str(out), *TINY]) == 0
    row = json.loads((out / "results.json").read_text())["rows"][0]
    assert list(row["methods"]) == ["none", "ngram", "ngram-chain", "model", "hybrid"]
    assert row["lossless"]["identical"]
    assert set(row["peers"]) == {"hf_plain", "hf_prompt_lookup", "hf_assisted", "hf_fp32_plain"}
