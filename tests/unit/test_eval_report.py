"""Aggregation, the Markdown summary and the plots, from hand-made result rows."""

import json

import pytest

from eval.report import (
    accepted_histogram,
    append_row,
    markdown,
    mismatches,
    plot,
    read_rows,
    summarize,
    write_report,
)


def method(text, tokens, decode_s, forwards, hist, by_source=None, identical=True, metrics=None):
    drafted = sum(s["drafted"] for s in (by_source or {}).values())
    accepted = sum(s["accepted"] for s in (by_source or {}).values())
    return {
        "raw_text": text,
        "text": text,
        "tokens": tokens,
        "decode_s": decode_s,
        "decode_tokens_per_s": tokens / decode_s,
        "mean_accepted_len": 1.0,
        "ttft_s": 0.01,
        "identical": identical,
        "tokens_agree": identical,
        "first_difference": None if identical else 3,
        "speedup": None,
        "metrics": metrics or {"exact_match_first_line": True, "edit_similarity": 0.5, "syntax_valid": True},
        "stats": {
            "target_forwards": forwards,
            "accepted": accepted,
            "drafted": drafted,
            "accepted_hist": {str(k): v for k, v in hist.items()},
            "by_source": by_source or {},
        },
    }


def row(case_id, ngram_decode_s, identical=True):
    none = method("abc def", 10, 2.0, 10, {0: 10})
    ngram = method(
        "abc def" if identical else "abc xyz",
        10,
        ngram_decode_s,
        5,
        {0: 3, 3: 1, 4: 1},  # 5 verify steps, 7 of the 12 drafted tokens accepted
        by_source={"ngram": {"drafted": 12, "accepted": 7, "steps": 4}},
        identical=identical,
        metrics={
            "exact_match_first_line": identical,
            "edit_similarity": 1.0 if identical else 0.5,
            "syntax_valid": True,
        },
    )
    none["speedup"], ngram["speedup"] = 1.0, 2.0 / ngram_decode_s
    return {
        "case_id": case_id,
        "kind": "body",
        "context_tokens": 100,
        "cold_ttft_s": 0.5,
        "methods": {"none": none, "ngram": ngram},
        "lossless": {"identical": identical, "mismatches": [] if identical else ["ngram"]},
        "peers": {
            "hf_plain": {
                "tokens": 10,
                "decode_s": 1.0,
                "decode_tokens_per_s": 10.0,
                "ttft_s": 0.2,
                "equal_engine_none": True,
            },
            "hf_prompt_lookup": {
                "tokens": 10,
                "decode_s": 0.8,
                "decode_tokens_per_s": 12.5,
                "ttft_s": 0.2,
                "equal_plain": False,
                "speedup_over_plain": 1.25,
            },
        },
    }


@pytest.fixture()
def rows():
    return [row("a.py:1:0:body", 1.0), row("b.py:2:4:statement", 0.5)]


def test_speedup_is_total_decode_time_over_total_decode_time(rows):
    s = summarize(rows)["methods"]["ngram"]
    assert s["speedup"] == pytest.approx(4.0 / 1.5, abs=1e-3)  # none 2 + 2 s, ngram 1 + 0.5 s
    assert s["speedup_geomean"] == pytest.approx((2.0 * 4.0) ** 0.5, rel=1e-3)
    assert s["decode_tokens_per_s"] == pytest.approx(20 / 1.5, rel=1e-3)


def test_acceptance_forwards_and_accepted_length(rows):
    s = summarize(rows)["methods"]["ngram"]
    assert s["acceptance_rate"] == {"ngram": pytest.approx(7 / 12, rel=1e-3)}
    assert s["forwards_per_token"] == pytest.approx(0.5)
    # (accepted draft tokens + one target token per step) / steps = (14 + 10) / 10
    assert s["mean_accepted_len"] == pytest.approx(2.4)
    assert accepted_histogram(rows, "ngram") == {0: 6, 3: 2, 4: 2}


def test_peers_are_compared_with_plain_generate(rows):
    peers = summarize(rows)["peers"]
    assert peers["hf_plain"]["equal_engine_none"] == 2
    assert peers["hf_prompt_lookup"]["equal_plain"] == 0
    assert peers["hf_prompt_lookup"]["speedup"] == pytest.approx(1.25)


def test_a_lossless_summary_says_so(rows):
    text = markdown(summarize(rows), {"suite": "repo", "target": "tiny-random"})
    assert "every output of every draft method equals plain decoding's (2 runs)" in text
    assert "| ngram | 2 |" in text
    assert "| hf_prompt_lookup | 2 |" in text
    assert "first-line exact match" in text


def test_the_header_names_the_kernels_numerics_where_it_multiplied(rows):
    meta = {"suite": "repo", "dtype": "float32"}
    assert "dtype float32, Linears bf16dot;" in markdown(summarize(rows), {**meta, "products": "bf16dot"})
    for products in ("torch", None):  # torch's own Linears, or a run recorded before the field
        assert "dtype float32;" in markdown(summarize(rows), {**meta, "products": products})
    with_cache = {**meta, "products": "bf16dot", "kv_cache": "bfloat16"}
    assert "dtype float32, Linears bf16dot, KV cache bfloat16;" in markdown(summarize(rows), with_cache)


def test_the_output_tokens_are_traced_to_their_origins(rows):
    for r in rows:
        r["methods"]["ngram"]["stats"]["by_origin"] = {
            "context": {"drafted": 8, "accepted": 5, "steps": 3},
            "outputs": {"drafted": 4, "accepted": 2, "steps": 1},
        }
    summary = summarize(rows)
    assert summary["methods"]["ngram"]["by_origin"] == {
        "context": {"drafted": 16, "accepted": 10},
        "outputs": {"drafted": 8, "accepted": 4},
    }
    text = markdown(summary, {"suite": "repo"})
    # 20 output tokens: 10 from the context's matches, 4 from earlier outputs, 6 the target's own
    assert "| method | context | outputs | rest |" in text
    assert "| ngram | 10/16 (50%) | 4/8 (20%) | 30% |" in text
    assert "| none |" not in text.split("Where the output tokens came from")[1].split("\n\n")[1]


def test_the_draft_budgets_prices_are_reported_as_medians(rows):
    assert "The draft budget's prices" not in markdown(summarize(rows), {"suite": "repo"})  # older rows
    for i, r in enumerate(rows):
        r["methods"]["ngram"]["prices"] = {
            "row": 0.1 + 0.1 * i,
            "row_timed": 0.05,
            "draft": 0.0,
            "draft_timed": 0.0,
        }
        r["methods"]["none"]["prices"] = {"row": 9.0, "row_timed": 9.0, "draft": 9.0, "draft_timed": 9.0}
    summary = summarize(rows)
    assert summary["methods"]["ngram"]["prices"] == {
        "row": 0.15,
        "row_timed": 0.05,
        "draft": 0.0,
        "draft_timed": 0.0,
    }
    text = markdown(summary, {"suite": "repo"})
    assert "| ngram | 0.050 | 0.150 | 0.000 | 0.000 |" in text
    assert "| none | 9.000" not in text  # plain decoding drafts nothing: no prices


def test_a_mismatch_is_reported_with_its_case_id(rows):
    rows.append(row("c.py:3:0:body", 1.0, identical=False))
    found = mismatches(rows)
    assert [(m["case_id"], m["method"], m["cause"]) for m in found] == [
        ("c.py:3:0:body", "ngram", "different tokens")
    ]
    text = markdown(summarize(rows), {"suite": "repo"})
    assert "Lossless check FAILED: 1 of 3 runs" in text
    assert "c.py:3:0:body" in text
    assert summarize(rows)["methods"]["ngram"]["identical"] == 2


def test_quality_is_averaged_per_method(rows):
    quality = summarize(rows)["methods"]["ngram"]["quality"]
    assert quality == {"edit_similarity": 1.0, "exact_match_first_line": 1.0, "syntax_valid": 1.0}


def test_plots_are_written(rows, tmp_path):
    written = plot(rows, summarize(rows), tmp_path)
    assert sorted(p.name for p in written) == ["accepted_lengths.png", "speedup.png", "ttft.png"]
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_write_report_keeps_one_row_per_case(rows, tmp_path):
    write_report(tmp_path, rows, {"suite": "repo"}, plots=False)
    results = json.loads((tmp_path / "results.json").read_text())
    assert [r["case_id"] for r in results["rows"]] == ["a.py:1:0:body", "b.py:2:4:statement"]
    assert (tmp_path / "summary.md").read_text().startswith("# repo: 2 cases")


def test_rows_file_drops_a_line_cut_short(tmp_path):
    path = tmp_path / "rows.jsonl"
    append_row(path, {"case_id": "a"})
    append_row(path, {"case_id": "b"})
    with path.open("a") as handle:
        handle.write('{"case_id": "c", "meth')  # the run was killed mid-write
    assert [r["case_id"] for r in read_rows(path)] == ["a", "b"]
    assert read_rows(tmp_path / "missing.jsonl") == []


def test_bench_drafts_rows_price_drafting_against_a_plain_step():
    from eval.bench_drafts import summary_rows

    def run(tokens, decode_s, steps, drafted, accepted, draft_s):
        stats = {"accepted_hist": {"0": steps}, "drafted": drafted, "accepted": accepted, "draft_s": draft_s}
        return {"tokens": tokens, "decode_s": decode_s, "stats": stats, "identical": True}

    methods = {
        "none": run(40, 0.8, 40, 0, 0, 0.0),  # a plain step: 20 ms
        "ngram": run(40, 0.6, 25, 30, 15, 0.005),
        "model": run(40, 0.5, 20, 40, 20, 0.12),  # 6 ms a step, 3 ms a drafted token: 0.15 of a step
        "hybrid": run(40, 0.5, 20, 40, 20, 0.08),
    }
    none, ngram, model, hybrid = summary_rows("head", [{"methods": methods}])
    assert none == "| head | none | 50.0 | 1.00x | 1.00 | – | 0.00 | 1/1 |"
    assert model == "| head | model | 80.0 | 1.60x | 2.00 | 20/40 (50%) | 6.00 / 3.00 (0.15) | 1/1 |"
    assert "| 0.20 / 0.17 (0.01) |" in ngram and "| 4.00 / 2.00 (0.10) |" in hybrid
