"""Turn result rows into the run's outputs: results.json, summary.md and PNG plots.

Aggregates are over cases, weighted by work: tokens/s is total tokens over total decode time, and
a method's speedup is the total decode time of plain decoding over its own on the same cases
(the geometric mean of per-case speedups is given beside it). Every speed is decode phase only:
wall time minus prefill (the target's, and a draft model's catch-up over the prompt), with the
target's prefill reused from a cold run so all methods start equal.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from completion_engine.types import ORIGINS
from eval.metrics import geometric_mean, median

QUALITY_LABELS = {
    "exact_match_first_line": "first-line exact match",
    "edit_similarity": "edit similarity",
    "syntax_valid": "syntax valid",
    "passed": "pass@1",
}


# -- aggregation ------------------------------------------------------------------------------


def method_names(rows: list[dict]) -> list[str]:
    names: list[str] = []
    for row in rows:
        names += [m for m in row["methods"] if m not in names]
    return names


def peer_names(rows: list[dict]) -> list[str]:
    names: list[str] = []
    for row in rows:
        names += [p for p in row.get("peers", {}) if p not in names]
    return names


def summarize_method(rows: list[dict], method: str) -> dict:
    """Aggregate speed, acceptance and quality of one engine method over the rows that ran it."""
    runs = [(row, row["methods"][method]) for row in rows if method in row["methods"]]
    if not runs:
        return {"cases": 0}
    tokens = sum(r["tokens"] for _, r in runs)
    decode_s = sum(r["decode_s"] for _, r in runs)
    plain_decode_s = sum(row["methods"]["none"]["decode_s"] for row, _ in runs)
    forwards = sum(r["stats"]["target_forwards"] for _, r in runs)
    steps = sum(sum(r["stats"]["accepted_hist"].values()) for _, r in runs)
    accepted = sum(r["stats"]["accepted"] for _, r in runs)
    by_source = _drafted_accepted([r["stats"]["by_source"] for _, r in runs])
    by_origin = _drafted_accepted([r["stats"].get("by_origin", {}) for _, r in runs])  # (older runs: none)
    tree_steps = sum(r["stats"].get("tree_steps", 0) for _, r in runs)
    tree_nodes = sum(r["stats"].get("tree_nodes", 0) for _, r in runs)
    priced = [r["prices"] for _, r in runs if r.get("prices")]  # (older runs: none)
    return {
        "cases": len(runs),
        "tokens": tokens,
        "tree_steps": tree_steps,
        "mean_tree_nodes": round(tree_nodes / tree_steps, 2) if tree_steps else None,
        "decode_s": round(decode_s, 4),
        "decode_tokens_per_s": round(tokens / decode_s, 2) if decode_s > 0 else 0.0,
        "speedup": round(plain_decode_s / decode_s, 3) if decode_s > 0 else None,
        "speedup_geomean": _round(geometric_mean([r["speedup"] for _, r in runs if r.get("speedup")])),
        "mean_accepted_len": round((accepted + steps) / steps, 3) if steps else 0.0,
        "acceptance_rate": {s: round(a / d, 4) if d else 0.0 for s, (d, a) in sorted(by_source.items())},
        "by_origin": {o: {"drafted": d, "accepted": a} for o, (d, a) in sorted(by_origin.items())},
        "prices": {name: _round(median([p[name] for p in priced]), 4) for name in priced[0]}
        if priced
        else {},
        "forwards_per_token": round(forwards / tokens, 4) if tokens else None,
        "median_ttft_s": _round(median([r["ttft_s"] for _, r in runs]), 4),
        "identical": sum(1 for _, r in runs if r.get("identical", True)),
        "quality": summarize_quality([r.get("metrics", {}) for _, r in runs]),
    }


def _drafted_accepted(counts: list[dict]) -> dict[str, list[int]]:
    """name -> [drafted, accepted], summed over runs' by_source or by_origin counts."""
    totals: dict[str, list[int]] = {}
    for per_name in counts:
        for name, s in per_name.items():
            total = totals.setdefault(name, [0, 0])
            total[0] += s["drafted"]
            total[1] += s["accepted"]
    return totals


def summarize_peer(rows: list[dict], peer: str) -> dict:
    runs = [(row, row["peers"][peer]) for row in rows if peer in row.get("peers", {})]
    if not runs:
        return {"cases": 0}
    tokens = sum(r["tokens"] for _, r in runs)
    decode_s = sum(r["decode_s"] for _, r in runs)
    plain = plain_peer(peer)
    plain_decode_s = sum(row["peers"][plain]["decode_s"] for row, _ in runs if plain in row["peers"])
    ttft_s = sum(r["ttft_s"] for _, r in runs)
    summary = {
        "cases": len(runs),
        "tokens": tokens,
        "decode_s": round(decode_s, 4),
        "decode_tokens_per_s": round(tokens / decode_s, 2) if decode_s > 0 else 0.0,
        "speedup": round(plain_decode_s / decode_s, 3) if decode_s > 0 else None,
        "speedup_geomean": _round(geometric_mean([r.get("speedup_over_plain") or 1.0 for _, r in runs])),
        "median_ttft_s": _round(median([r["ttft_s"] for _, r in runs]), 4),
        "median_edit_ttft_s": _round(median([r.get("edit_ttft_s", r["ttft_s"]) for _, r in runs]), 4),
        "prefill_tokens_per_s": round(sum(row["context_tokens"] for row, _ in runs) / ttft_s, 1)
        if ttft_s > 0
        else None,
        "plain": plain,
    }
    if peer == plain:
        summary["equal_engine_none"] = sum(1 for _, r in runs if r.get("equal_engine_none"))
    else:
        summary["equal_plain"] = sum(1 for _, r in runs if r.get("equal_plain"))
    return summary


def plain_peer(peer: str) -> str:
    """The plain decoding a peer's speculation is compared with: its own engine's.

    >>> plain_peer("hf_prompt_lookup"), plain_peer("vllm_suffix")
    ('hf_plain', 'vllm_plain')
    """
    return "vllm_plain" if peer.startswith("vllm") else "hf_plain"


def summarize_quality(metrics: list[dict]) -> dict:
    """Mean of every numeric or boolean metric (booleans become rates)."""
    names = sorted(
        {name for m in metrics for name, value in m.items() if isinstance(value, bool | int | float)}
    )
    return {
        name: round(
            sum(float(m[name]) for m in metrics if name in m) / sum(1 for m in metrics if name in m), 4
        )
        for name in names
    }


def mismatches(rows: list[dict]) -> list[dict]:
    """Every (case, method) whose output differs from plain decoding's, with where it diverges."""
    found = []
    for row in rows:
        plain = row["methods"]["none"].get("raw_text", row["methods"]["none"]["text"])
        for method, result in row["methods"].items():
            if not result.get("identical", True):
                index = result.get("first_difference") or 0
                found.append(
                    {
                        "case_id": row["case_id"],
                        "method": method,
                        # same tokens but a different cut: the stop check depended on how text arrived
                        "cause": "different stop point" if result.get("tokens_agree") else "different tokens",
                        "first_difference": index,
                        "plain": plain[max(index - 20, 0) : index + 40],
                        "method_text": result.get("raw_text", result["text"])[
                            max(index - 20, 0) : index + 40
                        ],
                    }
                )
    return found


def accepted_histogram(rows: list[dict], method: str) -> Counter:
    """Verify steps by accepted draft length, over every case."""
    histogram: Counter = Counter()
    for row in rows:
        result = row["methods"].get(method)
        if result:
            histogram.update({int(k): v for k, v in result["stats"]["accepted_hist"].items()})
    return histogram


def summarize_variants(rows: list[dict]) -> dict:
    """Quality of each option variant (plain decoding) over the rows that ran it."""
    names = list(dict.fromkeys(name for row in rows for name in row.get("variants", {})))
    return {
        name: {
            "cases": sum(1 for row in rows if name in row.get("variants", {})),
            "quality": summarize_quality(
                [row["variants"][name]["metrics"] for row in rows if name in row.get("variants", {})]
            ),
        }
        for name in names
    }


def summarize(rows: list[dict]) -> dict:
    return {
        "variants": summarize_variants(rows),
        "cases": len(rows),
        "methods": {m: summarize_method(rows, m) for m in method_names(rows)},
        "peers": {p: summarize_peer(rows, p) for p in peer_names(rows)},
        "lossless_mismatches": mismatches(rows),
        "median_cold_ttft_s": _round(median([row["cold_ttft_s"] for row in rows]), 4),
        "median_edit_ttft_s": _round(median([row["edit_ttft_s"] for row in rows if "edit_ttft_s" in row]), 4),
        "prefill_tokens_per_s": _prefill_speed(rows),
        "median_context_tokens": median([row["context_tokens"] for row in rows]),
    }


def _prefill_speed(rows: list[dict]) -> float | None:
    """The engine's cold prefill: context tokens computed over the time it took, all cases together."""
    timed = [row for row in rows if row.get("cold_prefill_s")]
    seconds = sum(row["cold_prefill_s"] for row in timed)
    return round(sum(row["cold_prefill_tokens"] for row in timed) / seconds, 1) if seconds > 0 else None


# -- Markdown ---------------------------------------------------------------------------------


def products_note(meta: dict) -> str:
    """The Linears' numerics where the row-invariant kernel multiplied and the KV cache's dtype, e.g.
    ", Linears bf16dot, KV cache bfloat16"; "" for neither."""
    products = meta.get("products")
    note = f", Linears {products}" if products and products != "torch" else ""
    return note + (f", KV cache {meta['kv_cache']}" if meta.get("kv_cache") else "")


def markdown(summary: dict, meta: dict) -> str:
    lines = [f"# {meta.get('suite', 'eval')}: {summary['cases']} cases", ""]
    if meta.get("command"):
        lines += [f"Command: `{meta['command']}`", ""]
    facts = [
        f"target `{meta.get('target')}`",
        f"draft model `{meta.get('draft_model')}`" if meta.get("draft_model") else "no draft model",
        f"dtype {meta.get('dtype')}" + products_note(meta),
        f"peers in {meta['peer_dtype']}" if meta.get("peer_dtype") else None,
        "exact" if meta.get("exact", True) else "inexact",
        f"max_new_tokens {meta.get('max_new_tokens')}",
        f"stop by {meta.get('stopper')}",
        f"{meta.get('torch_threads')} torch threads on {meta.get('cpu')}",
        f"median context {summary['median_context_tokens']} tokens",
        f"median cold TTFT {_fmt(summary['median_cold_ttft_s'])} s",
    ]
    lines += ["; ".join(f for f in facts if f) + ".", ""]
    for note in meta.get("notes", []):
        lines += [f"Note: {note}", ""]
    lines += speed_table(summary)
    lines += sections(origin_table(summary), prices_table(summary))
    lines += [""] + lossless_section(summary)
    lines += sections(quality_table(summary), variant_table(summary))
    return "\n".join(lines) + "\n"


def sections(*tables: list[str]) -> list[str]:
    """The tables that have lines, each after a blank line.

    >>> sections(["a"], [], ["b", "c"])
    ['', 'a', '', 'b', 'c']
    """
    return [line for table in tables if table for line in ["", *table]]


def origin_table(summary: dict) -> list[str]:
    """Where each drafting method's output tokens came from: accepted drafts by origin (accepted of
    drafted, and their share of all output tokens), the rest the target's own tokens (counted as
    verified: the stop policy may cut some accepted tokens off the end)."""
    methods = {m: s for m, s in summary["methods"].items() if s.get("by_origin")}
    if not methods:
        return []
    seen = {origin for s in methods.values() for origin in s["by_origin"]}
    origins = [o for o in ORIGINS if o in seen] + sorted(seen - set(ORIGINS))
    lines = [
        "Where the output tokens came from: accepted draft tokens by origin (accepted / drafted, and "
        "their share of the output; counted as verified, before the stop policy cuts the end); rest: "
        "the target's own tokens.",
        "",
        "| method | " + " | ".join(origins) + " | rest |",
        "|---|" + "---|" * (len(origins) + 1),
    ]
    for method, s in methods.items():
        tokens = max(s.get("tokens", 0), 1)
        cells = []
        for origin in origins:
            c = s["by_origin"].get(origin)
            cells.append(f"{c['accepted']}/{c['drafted']} ({c['accepted'] / tokens:.0%})" if c else "-")
        accepted = sum(c["accepted"] for c in s["by_origin"].values())
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {(tokens - accepted) / tokens:.0%} |")
    return lines


def prices_table(summary: dict) -> list[str]:
    """What the draft budget priced a verify row and a draft-model token at, timed at load and as
    the decode steps corrected it, for each drafting method (medians over the cases)."""
    methods = {m: s["prices"] for m, s in summary["methods"].items() if m != "none" and s.get("prices")}
    if not methods:
        return []
    lines = [
        "The draft budget's prices after each method's runs, in 1-row steps (medians over the cases, at "
        "each case's context): one more verify row and a draft-model token, as timed when the engine "
        "loaded and as the decode steps' timings corrected them.",
        "",
        "| method | verify row, timed | verify row, corrected | draft token, timed "
        "| draft token, corrected |",
        "|---|---|---|---|---|",
    ]
    for method, p in methods.items():
        cells = [_fmt(p.get(name), 3) for name in ("row_timed", "row", "draft_timed", "draft")]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines


def speed_table(summary: dict) -> list[str]:
    """Every method and peer of one run on the same cases: decode, prefill and time to first token."""
    hf_plain = summary["peers"].get("hf_plain", {}).get("decode_tokens_per_s")
    engine_prefill = _fmt(summary.get("prefill_tokens_per_s"), 0)
    cold, edit = _fmt(summary["median_cold_ttft_s"], 3), _fmt(summary.get("median_edit_ttft_s"), 3)
    lines = [
        "Decode: tokens/s of the decode phase (wall time minus prefill and minus a draft model's catch-up "
        "over the prompt). Speedup: plain decoding's total "
        "decode time over the method's, same cases (geometric mean of per-case speedups in brackets); "
        "engine methods against the engine's `none`, peers against their own plain decoding. vs HF plain: "
        "decode tokens/s over stock `generate()`'s (the peers run bf16 where the hardware multiplies "
        "bf16, else float32; hf_fp32_plain runs float32). "
        "Prefill: context tokens/s of a cold prefill. "
        "TTFT: medians of a cold request and of one after typing one character (the engine reuses its KV "
        "prefix; HF keeps no cache and prefills again; vLLM reuses its prefix cache).",
        "",
        "| method | cases | decode tok/s | vs HF plain | speedup | mean accepted len | acceptance | "
        "target fwd/token | prefill tok/s | cold TTFT s | edit TTFT s | same output as plain |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for method, s in summary["methods"].items():
        acceptance = ", ".join(f"{src} {rate:.0%}" for src, rate in s["acceptance_rate"].items()) or "-"
        if s.get("tree_steps"):
            acceptance += f"; {s['tree_steps']} trees of {s['mean_tree_nodes']:.1f} nodes"
        lines.append(
            f"| {method} | {s['cases']} | {s['decode_tokens_per_s']:.1f} | "
            f"{_ratio(s['decode_tokens_per_s'], hf_plain)} | {_fmt(s['speedup'])}x "
            f"({_fmt(s['speedup_geomean'])}) | {s['mean_accepted_len']:.2f} | {acceptance} | "
            f"{_fmt(s['forwards_per_token'])} | {engine_prefill} | {cold} | {edit} | "
            f"{s['identical']}/{s['cases']} |"
        )
    for peer, s in summary["peers"].items():
        if peer == s.get("plain", "hf_plain"):
            same = f"{s['equal_engine_none']}/{s['cases']} equal engine `none`"
        else:
            same = f"{s.get('equal_plain', 0)}/{s['cases']} equal {s.get('plain', 'hf_plain')}"
        lines.append(
            f"| {peer} | {s['cases']} | {s['decode_tokens_per_s']:.1f} | "
            f"{_ratio(s['decode_tokens_per_s'], hf_plain)} | {_fmt(s['speedup'])}x "
            f"({_fmt(s['speedup_geomean'])}) | - | - | - | {_fmt(s.get('prefill_tokens_per_s'), 0)} | "
            f"{_fmt(s['median_ttft_s'], 3)} | {_fmt(s.get('median_edit_ttft_s'), 3)} | {same} |"
        )
    return lines


def lossless_section(summary: dict) -> list[str]:
    found = summary["lossless_mismatches"]
    runs = sum(s["cases"] for m, s in summary["methods"].items() if m != "none")
    if not found:
        return [f"Lossless check: every output of every draft method equals plain decoding's ({runs} runs)."]
    lines = [
        f"**Lossless check FAILED: {len(found)} of {runs} runs differ from plain decoding.**",
        "",
        "| case | method | cause | first differing char | plain | method |",
        "|---|---|---|---|---|---|",
    ]
    for m in found:
        lines.append(
            f"| {m['case_id']} | {m['method']} | {m['cause']} | {m['first_difference']} | "
            f"`{_cell(m['plain'])}` | `{_cell(m['method_text'])}` |"
        )
    return lines


def quality_table(summary: dict) -> list[str]:
    names = sorted({n for s in summary["methods"].values() for n in s.get("quality", {})})
    names = [n for n in QUALITY_LABELS if n in names]
    if not names:
        return []
    lines = [
        "| method | " + " | ".join(QUALITY_LABELS[n] for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for method, s in summary["methods"].items():
        cells = [_quality_cell(n, s["quality"].get(n)) for n in names]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines


def variant_table(summary: dict) -> list[str]:
    """Completion-option variants, same cases, plain decoding."""
    variants = summary.get("variants") or {}
    names = [n for n in QUALITY_LABELS if any(n in v["quality"] for v in variants.values())]
    if not variants or not names:
        return []
    lines = [
        "Option variants (same cases, plain decoding):",
        "",
        "| variant | cases | " + " | ".join(QUALITY_LABELS[n] for n in names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for name, v in variants.items():
        cells = [_quality_cell(n, v["quality"].get(n)) for n in names]
        lines.append(f"| {name} | {v['cases']} | " + " | ".join(cells) + " |")
    return lines


def _quality_cell(name: str, value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if name == "edit_similarity" else f"{value:.0%}"


# -- plots ------------------------------------------------------------------------------------


def plot(rows: list[dict], summary: dict, folder: Path) -> list[Path]:
    """speedup.png, accepted_lengths.png and ttft.png in `folder`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    written = []

    # Speedup per method: per-case points over a bar of the aggregate.
    labels, aggregates, points = [], [], []
    for method, s in summary["methods"].items():
        labels.append(method)
        aggregates.append(s["speedup"] or 0.0)
        points.append([row["methods"][method]["speedup"] or 0.0 for row in rows if method in row["methods"]])
    for peer, s in summary["peers"].items():
        labels.append(peer)
        aggregates.append(s["speedup"] or 0.0)
        points.append(
            [
                row["peers"][peer].get("speedup_over_plain") or 1.0
                for row in rows
                if peer in row.get("peers", {})
            ]
        )
    figure, axes = plt.subplots(figsize=(max(5, 1.2 * len(labels)), 4))
    colours = ["tab:blue" if label in summary["methods"] else "tab:gray" for label in labels]
    axes.bar(labels, aggregates, color=colours, alpha=0.6)
    for index, values in enumerate(points):
        axes.scatter([index] * len(values), values, color="black", s=10, zorder=3)
    axes.axhline(1.0, color="red", linewidth=0.8)
    axes.set_ylabel("decode-phase speedup over plain")
    axes.set_title("Decode-phase speedup (bars: all cases; dots: per case; grey: HF)", fontsize=10)
    written.append(_save(figure, folder / "speedup.png"))

    # Accepted draft length per verify step.
    drafting = [m for m in summary["methods"] if m != "none"]
    figure, axes = plt.subplots(figsize=(6, 4))
    width = 0.8 / max(len(drafting), 1)
    for offset, method in enumerate(drafting):
        histogram = accepted_histogram(rows, method)
        steps = sum(histogram.values()) or 1
        lengths = sorted(histogram)
        axes.bar(
            [n + offset * width for n in lengths],
            [histogram[n] / steps for n in lengths],
            width,
            label=method,
        )
    axes.set_xlabel("draft tokens accepted in a verify step")
    axes.set_ylabel("share of verify steps")
    axes.set_title("Accepted lengths")
    if drafting:
        axes.legend()
    written.append(_save(figure, folder / "accepted_lengths.png"))

    # Time to first token: the cold prefill, each method after it, and the HF peers (full prefill each).
    series = {"engine cold": [row["cold_ttft_s"] for row in rows]}
    for method in summary["methods"]:
        series[f"{method} (warm)"] = [
            row["methods"][method]["ttft_s"] for row in rows if method in row["methods"]
        ]
    if "hf_plain" in summary["peers"]:
        series["HF generate"] = [row["peers"]["hf_plain"]["ttft_s"] for row in rows if "peers" in row]
    figure, axes = plt.subplots(figsize=(max(5, 1.3 * len(series)), 4))
    axes.boxplot(list(series.values()), tick_labels=list(series))
    axes.set_ylabel("time to first token (s)")
    axes.set_title("TTFT distribution")
    axes.tick_params(axis="x", labelrotation=20)
    written.append(_save(figure, folder / "ttft.png"))
    return written


def _save(figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(figure)
    return path


# -- files ------------------------------------------------------------------------------------


def write_report(folder: Path, rows: list[dict], meta: dict, plots: bool = True) -> str:
    """results.json (meta, summary, one row per case), summary.md and the plots; return the Markdown."""
    summary = summarize(rows)
    (folder / "results.json").write_text(
        json.dumps({"meta": meta, "summary": summary, "rows": rows}, indent=1)
    )
    text = markdown(summary, meta)
    if plots and rows:
        written = plot(rows, summary, folder)
        text += "\nPlots: " + ", ".join(p.name for p in written) + "\n"
    (folder / "summary.md").write_text(text)
    return text


def read_rows(path: Path) -> list[dict]:
    """Rows of a JSON-lines file; a line cut short by an interrupted run is dropped."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def append_row(path: Path, row: dict) -> None:
    with path.open("a") as handle:
        handle.write(json.dumps(row) + "\n")
        handle.flush()


def _round(value: float | None, digits: int = 3) -> float | None:
    return round(value, digits) if value is not None else None


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ratio(value: float | None, reference: float | None) -> str:
    if not value or not reference:
        return "-"
    return f"{value / reference:.2f}x"


def _cell(text: str) -> str:
    return text.replace("\n", "\\n").replace("|", "\\|").replace("`", "'")
