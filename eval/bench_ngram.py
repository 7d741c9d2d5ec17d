"""Cost of n-gram drafting with many large open documents (the editor case).

    python -m eval.bench_ngram [--docs 20] [--lines 2000]

Builds the corpus from real standard-library files, repeated to the requested size, with the
embedded model's tokenizer, then times: indexing one document, and one `propose` over the corpus.
"""

from __future__ import annotations

import argparse
import random
import sys
import sysconfig
import time
from pathlib import Path

from completion_engine.drafting import DocumentCorpus, NgramDrafter


def source_lines(count: int, seed: int) -> str:
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    rng = random.Random(seed)
    lines: list[str] = []
    while len(lines) < count:
        lines += rng.choice(files).read_text(encoding="utf-8", errors="replace").splitlines()
    return "\n".join(lines[:count])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--docs", type=int, default=20)
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args(argv)
    from completion_engine.models import load_model

    tokenizer = load_model("smollm2-135m", progress=False).tokenizer
    documents = [
        tokenizer.encode(source_lines(args.lines, seed), add_special_tokens=False)
        for seed in range(args.docs)
    ]
    corpus = DocumentCorpus(min_n=2)
    start = time.perf_counter()
    for i, tokens in enumerate(documents):
        corpus.set_document(f"doc{i}", tokens)
    index_ms = (time.perf_counter() - start) / len(documents) * 1e3
    drafter = NgramDrafter(corpus, 2, 8)
    context = documents[0][:2000]
    rng = random.Random(0)
    found = 0
    start = time.perf_counter()
    for _ in range(args.queries):
        cut = rng.randrange(100, len(context))
        found += bool(drafter.propose(context[:cut], k=10).tokens)
    propose_ms = (time.perf_counter() - start) / args.queries * 1e3
    print(
        f"{args.docs} documents x {args.lines} lines = {corpus.total_tokens:,} tokens; "
        f"indexing {index_ms:.2f} ms per document; propose {propose_ms:.3f} ms per call "
        f"({found}/{args.queries} found a draft)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
