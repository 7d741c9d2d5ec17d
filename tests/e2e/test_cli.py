"""`spec-complete complete`: JSON output, streaming, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from completion_engine.cli import format_stats, main
from completion_engine.types import Stats

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SAMPLE, SHAPES = str(EXAMPLES / "sample.py"), str(EXAMPLES / "shapes.py")
SAMPLE_CURSOR = ["--line", "23", "--col", "0"]  # the body of Ellipse.area


def run_json(capsys, *args: str) -> dict:
    assert main(["complete", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_output_has_text_and_stats(capsys):
    out = run_json(capsys, SAMPLE, *SAMPLE_CURSOR, "--target", "tiny-random", "--max-new-tokens", "12")
    for field in (
        "text",
        "tokens",
        "target_forwards",
        "drafted",
        "accepted",
        "prefill_s",
        "draft_prefill_s",
        "decode_s",
        "ttft_s",
        "wall_s",
        "draft_s",
    ):
        assert field in out
    assert 0 <= out["draft_s"] <= out["decode_s"] + 1e-3  # (each rounded to 0.1 ms)
    assert abs(out["decode_s"] - (out["wall_s"] - out["prefill_s"] - out["draft_prefill_s"])) < 1e-3
    assert isinstance(out["text"], str) and 0 < out["tokens"] <= 12
    assert "ngram" in out["by_source"] or out["drafted"] == 0


@pytest.mark.parametrize("catch_up", [0.0, 0.25])
def test_the_stats_line_shows_a_drafts_catch_up_apart_from_the_decode(catch_up):
    stats = Stats(tokens=10, prefill_s=0.5, draft_prefill_s=catch_up, ttft_s=0.6, wall_s=2.0)
    line = format_stats(stats.as_dict())
    assert ("draft catch-up 0.250 s" in line) == (catch_up > 0)
    assert f"decode {2.0 - 0.5 - catch_up:.3f} s" in line


def test_every_draft_method_gives_the_same_text(capsys):
    texts = {
        method: run_json(
            capsys,
            SAMPLE,
            *SAMPLE_CURSOR,
            "--open",
            SHAPES,
            "--target",
            "tiny-random",
            "--draft",
            method,
            "--max-new-tokens",
            "16",
            "--no-syntax",
        )["text"]
        for method in ("none", "ngram")
    }
    assert texts["ngram"] == texts["none"]


def test_streams_text_then_prints_stats(capsys):
    assert main(["complete", SAMPLE, *SAMPLE_CURSOR, "--target", "tiny-random", "--max-new-tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert "target forwards" in out and "ttft" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.py", "--line", "0", "--col", "0"], "file not found"),
        ([SAMPLE, "--line", "999", "--col", "0"], "line 999 is out of range"),
        ([SAMPLE, "--line", "0", "--col", "500"], "column 500 is out of range"),
        ([SAMPLE, "--line", "0", "--col", "0", "--draft", "magic"], "unknown draft method"),
        ([SAMPLE, "--line", "0", "--col", "0", "--draft", "model"], "needs a draft model (--draft-model)"),
        ([SAMPLE, "--line", "0", "--col", "0", "--target", "/nonexistent/model"], "model not found"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(capsys, args, message):
    code = main(["complete", *args] + ([] if "--target" in args else ["--target", "tiny-random"]))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) >= 1 and message in err[-1] and err[-1].startswith("spec-complete: error:")


@pytest.mark.embedded
def test_embedded_model_completes_with_json():
    """The real default model: fetched and converted on first use, then loaded from the cache."""
    command = [
        sys.executable,
        "-m",
        "completion_engine.cli",
        "complete",
        SAMPLE,
        *SAMPLE_CURSOR,
        "--open",
        SHAPES,
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    outputs = {}
    for method in ("none", "ngram"):
        result = subprocess.run(
            [*command, "--draft", method, "--max-new-tokens", "24", "--json"],
            capture_output=True,
            text=True,
            timeout=900,
            env=env,
            check=False,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        outputs[method] = json.loads(result.stdout)
    assert outputs["none"]["tokens"] > 0
    assert outputs["ngram"]["text"] == outputs["none"]["text"]
