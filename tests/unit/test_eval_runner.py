"""The case runner on a tiny random model: every method on a case, lossless check, speed rows."""

import pytest

from completion_engine.completion import CompletionOptions
from completion_engine.config import EngineConfig
from completion_engine.engine import CompletionEngine
from eval.cases import BODY, STATEMENT, Case
from eval.runner import CaseRunner, compare_to_plain, plan_methods, tokens_agree
from eval.suite import ResumeError, prepare_folder, run_cases

SOURCE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"


def case(case_id="m.py:5:0:body", kind=BODY):
    prefix = SOURCE + "\n\ndef mul(a, b):\n" if kind == BODY else SOURCE + "\n\nx = add("
    reference = "    return a * b\n" if kind == BODY else "1, 2)"
    return Case(case_id, kind, prefix, reference, "", min_indent=4, open_documents={"other.py": SOURCE * 3})


@pytest.fixture(scope="module")
def engine(tiny_target):
    return CompletionEngine(EngineConfig(target="tiny", max_draft=6), tiny_target)


def score(case, completion):
    return {"edit_similarity": 0.0, "length": len(completion)}


def test_plan_methods_puts_none_first_and_skips_methods_without_a_draft_model():
    assert plan_methods(["ngram"], False) == (("none", "ngram"), {})
    methods, skipped = plan_methods(["hybrid", "none", "ngram", "model"], False)
    assert methods == ("none", "ngram")
    assert set(skipped) == {"hybrid", "model"}
    assert plan_methods(["model"], True) == (("none", "model"), {})
    with pytest.raises(ValueError):
        plan_methods(["beam"], True)


def test_tokens_agree_up_to_the_shorter_list():
    assert tokens_agree([1, 2, 3], [1, 2, 3, 4, 5])  # speculation verified past the stop point
    assert not tokens_agree([1, 2, 3], [1, 9, 3])
    assert tokens_agree([], [7])


def test_compare_to_plain_flags_a_different_text():
    def result(text, tokens, decode_s):
        return {"raw_text": text, "token_ids": tokens, "decode_s": decode_s}

    rows = {
        "none": result("ab", [1, 2], 2.0),
        "ngram": result("ab", [1, 2, 5], 1.0),
        "model": result("ax", [1, 3], 1.0),
    }
    assert compare_to_plain(rows) == ["model"]
    assert rows["ngram"]["identical"] and rows["ngram"]["speedup"] == 2.0
    assert rows["model"]["first_difference"] == 1


def test_every_method_runs_on_a_case_and_matches_plain_decoding(engine):
    runner = CaseRunner(engine, CompletionOptions(max_new_tokens=12), ("none", "ngram"), score)
    row = runner.run(case())
    assert row["case_id"] == "m.py:5:0:body"
    assert set(row["methods"]) == {"none", "ngram"}
    assert row["lossless"] == {"identical": True, "mismatches": []}
    plain, ngram = row["methods"]["none"], row["methods"]["ngram"]
    assert plain["raw_text"] == ngram["raw_text"]
    assert plain["forwards_per_token"] >= ngram["forwards_per_token"]
    assert plain["stats"]["prefill_tokens"] == 0  # the cold prefill ran before: every method reuses it all
    assert row["cold_prefill_tokens"] == row["context_tokens"]
    assert ngram["metrics"]["length"] == len(ngram["text"])
    assert "ngram" in ngram["acceptance_rate"] or ngram["stats"]["drafted"] == 0
    prices = engine.budget.prices(row["context_tokens"])
    assert ngram["prices"] == {
        "row": prices.row,
        "row_timed": prices.row_timed,
        "draft": prices.draft,
        "draft_timed": prices.draft_timed,
    }


def test_open_documents_follow_the_case(engine):
    runner = CaseRunner(engine, CompletionOptions(max_new_tokens=2), ("none",), score)
    runner.run(case())
    assert "other.py" in engine.corpus
    runner.run(Case("s.py:1:0:statement", STATEMENT, "x = (", "1)", open_documents={"else.py": "y = 2\n"}))
    assert "other.py" not in engine.corpus
    assert "else.py" in engine.corpus


class CountingRunner:
    def __init__(self):
        self.ran = []

    def run(self, case):
        self.ran.append(case.case_id)
        return {"case_id": case.case_id}


def test_resume_skips_the_cases_already_done(tmp_path):
    cases = [case(f"m.py:{i}:0:body") for i in range(3)]
    first = CountingRunner()
    assert len(run_cases(cases[:2], first, tmp_path, resume=False, progress=False)) == 2
    with (tmp_path / "rows.jsonl").open("a") as handle:
        handle.write('{"case_id": "m.py:2:0:bo')  # interrupted while writing the third
    again = CountingRunner()
    rows = run_cases(cases, again, tmp_path, resume=True, progress=False)
    assert again.ran == ["m.py:2:0:body"]
    assert [r["case_id"] for r in rows] == [c.case_id for c in cases]


def test_a_new_run_does_not_overwrite_results_and_a_resume_keeps_its_settings(tmp_path):
    meta = {"suite": "repo", "target": "tiny", "max_new_tokens": 8}
    prepare_folder(tmp_path, meta, resume=False)
    (tmp_path / "rows.jsonl").write_text('{"case_id": "a"}\n')
    with pytest.raises(ResumeError):
        prepare_folder(tmp_path, meta, resume=False)
    prepare_folder(tmp_path, meta, resume=True)
    with pytest.raises(ResumeError, match="max_new_tokens"):
        prepare_folder(tmp_path, {**meta, "max_new_tokens": 16}, resume=True)


def test_repeats_keep_the_fastest_run_and_check_that_greedy_repeats_itself(engine):
    runner = CaseRunner(engine, CompletionOptions(max_new_tokens=6), ("none", "ngram"), score, repeats=2)
    row = runner.run(case())
    for result in row["methods"].values():
        assert len(result["decode_s_repeats"]) == 2
        assert result["decode_s"] == min(result["decode_s_repeats"])
    assert row["lossless"]["identical"]


def test_option_variants_are_graded_on_the_same_case(engine):
    from eval.report import summarize_variants, variant_table

    variants = {"no-healing": {"healing": False}, "no-fim": {"fim": "off"}}
    runner = CaseRunner(engine, CompletionOptions(max_new_tokens=6), ("none",), score, variants=variants)
    row = runner.run(case())
    assert list(row["variants"]) == ["default", "no-healing", "no-fim"]
    assert row["variants"]["default"]["text"] == row["methods"]["none"]["text"]
    assert row["variants"]["no-fim"]["text"] == row["methods"]["none"]["text"]  # the tiny model has no FIM
    summary = summarize_variants([row])
    assert summary["no-healing"]["cases"] == 1
    table = variant_table({"variants": summary})
    assert table[2] == "| variant | cases | edit similarity |"
    assert table[-1] == "| no-fim | 1 | 0.000 |"


def test_runs_record_how_the_linears_multiply():
    import torch

    from completion_engine import row_invariant
    from eval.options import linear_products

    assert linear_products(EngineConfig(target="t", dtype="bfloat16", device="cpu")) == "torch"
    on_kernel = row_invariant.usable(torch.float32, torch.device("cpu"))
    expected = row_invariant.numerics() if on_kernel else "torch"
    assert linear_products(EngineConfig(target="t", dtype="float32", device="cpu")) == expected


def test_runs_record_the_kv_caches_dtype(engine):
    from eval.options import kv_cache_label

    assert kv_cache_label(engine) == str(engine.target_runner.cache.keys.dtype).removeprefix("torch.")
    assert kv_cache_label(engine) in ("float32", "bfloat16", "float16")
