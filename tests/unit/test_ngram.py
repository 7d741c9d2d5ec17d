"""N-gram (prompt lookup) matching on short token arrays."""

from __future__ import annotations

import numpy as np

from completion_engine.drafting.ngram import DocumentCorpus, NgramDrafter, continue_periodically, find_draft
from completion_engine.drafting.ngram_index import (
    DocumentIndex,
    extend_backwards,
    match_in_context,
    ngram_hashes,
    ngram_key,
)


def arr(*tokens: int) -> np.ndarray:
    return np.array(tokens, dtype=np.int64)


def test_worked_example_from_the_docstring():
    match, draft, origin = find_draft(arr(1, 2, 3, 4, 2, 3), None, min_n=2, max_n=4, k=3)
    assert (match.length, match.end, origin) == (2, 2, "context")
    assert draft.tolist() == [4, 2, 3]


def test_longest_match_wins_over_a_more_recent_shorter_one():
    #               v longest (3 tokens: 7 2 3) ... v more recent but shorter (2 3)
    context = arr(7, 2, 3, 50, 51, 9, 2, 3, 60, 7, 2, 3)
    match = match_in_context(context, min_n=2, max_n=5)
    assert (match.length, match.end) == (3, 2)


def test_recency_breaks_ties():
    context = arr(2, 3, 10, 2, 3, 20, 2, 3)
    match, draft, _ = find_draft(context, None, min_n=2, max_n=4, k=1)
    assert match.end == 4 and draft.tolist() == [20]


def test_no_match_gives_an_empty_draft():
    drafter = NgramDrafter(None, min_n=2, max_n=4)
    draft = drafter.propose([1, 2, 3, 4, 5], k=4)
    assert draft.tokens == [] and draft.probs is None


def test_matches_across_documents():
    corpus = DocumentCorpus(min_n=2)
    corpus.set_document("a.py", [100, 101, 102, 103])
    corpus.set_document("b.py", [5, 6, 7, 8, 9, 10, 11])
    draft = NgramDrafter(corpus, 2, 6).propose([1, 6, 7], k=3)
    assert draft.tokens == [8, 9, 10] and draft.match_len == 2


def test_longer_match_in_an_older_document_beats_the_context():
    corpus = DocumentCorpus(min_n=2)
    corpus.set_document("old.py", [4, 5, 6, 7, 42, 43])
    draft = NgramDrafter(corpus, 2, 6).propose([6, 7, 99, 5, 6, 7], k=2)
    assert draft.tokens == [42, 43] and draft.match_len == 3  # 5 6 7 here; 6 7 only in the context


def test_most_recent_document_wins_a_tie():
    corpus = DocumentCorpus(min_n=2)
    corpus.set_document("first.py", [1, 2, 30])
    corpus.set_document("second.py", [1, 2, 40])
    assert NgramDrafter(corpus, 2, 4).propose([9, 1, 2], k=1).tokens == [40]
    corpus.set_document("first.py", [1, 2, 30])  # edited again: now the most recent
    assert NgramDrafter(corpus, 2, 4).propose([9, 1, 2], k=1).tokens == [30]


def test_edited_document_stops_producing_stale_matches():
    corpus = DocumentCorpus(min_n=2)
    corpus.set_document("a.py", [1, 2, 3, 4])
    drafter = NgramDrafter(corpus, 2, 4)
    assert drafter.propose([9, 1, 2], k=2).tokens == [3, 4]
    corpus.set_document("a.py", [1, 2, 7, 8])
    assert drafter.propose([9, 1, 2], k=2).tokens == [7, 8]
    corpus.remove_document("a.py")
    assert drafter.propose([9, 1, 2], k=2).tokens == []


def test_a_match_at_the_end_of_a_document_has_nothing_to_draft():
    index = DocumentIndex(arr(5, 6, 1, 2), min_n=2)
    assert index.find(arr(1, 2), max_n=4).length == 0


def test_repetition_in_the_context_continues_periodically():
    assert continue_periodically(arr(1, 2, 1, 2, 1), end=2, k=5).tolist() == [2, 1, 2, 1, 2]
    draft = NgramDrafter(None, 2, 4).propose([7, 8, 9, 7, 8, 9, 7, 8], k=5)
    assert draft.tokens == [9, 7, 8, 9, 7]


def test_corpus_cap_drops_the_oldest_documents():
    corpus = DocumentCorpus(min_n=2, max_tokens=10)
    corpus.set_document("old", list(range(6)))
    corpus.set_document("new", list(range(6)))
    assert "old" not in corpus and "new" in corpus and corpus.total_tokens == 6


def test_continuations_keep_every_longest_match_and_the_tree_merges_them():
    import numpy as np

    from completion_engine.drafting.ngram import DocumentCorpus, find_continuations
    from completion_engine.drafting.tree import candidate_tree

    corpus = DocumentCorpus(min_n=2)
    corpus.set_document("a", [1, 2, 3, 10, 11])
    corpus.set_document("b", [1, 2, 3, 20, 21])
    context = np.array([7, 8, 2, 3], dtype=np.int64)
    longest, continuations = find_continuations(context, corpus, min_n=2, max_n=4, k=2)
    assert longest == 2
    assert sorted(tuple(c.tokens) for c in continuations) == [(10, 11), (20, 21)]
    tokens, parents, origins = candidate_tree(continuations, budget=4)
    assert sorted(tokens) == [10, 11, 20, 21] and origins == ["documents"] * 4
    assert [tokens[i] for i, p in enumerate(parents) if p == -1] in ([20, 10], [10, 20])  # two branches


def test_a_unanimous_candidate_tree_is_a_chain_and_the_budget_holds():
    from completion_engine.drafting.tree import Continuation, candidate_tree

    tokens, parents, _ = candidate_tree([Continuation([4, 5, 6, 7], 3.0)] * 3, budget=3)
    assert tokens == [4, 5, 6] and parents == [-1, 0, 1]
    assert candidate_tree([], budget=5) == ([], [], [])


def test_each_drafted_token_names_where_its_match_was():
    from completion_engine.types import OUTPUTS

    corpus = DocumentCorpus(min_n=2)
    corpus.set_document("file:///a.py", [1, 2, 3, 10, 11, 12])
    corpus.set_document("@output/0", [1, 2, 3, 20, 21, 22], OUTPUTS)
    # no match in the context: a tree over the document's and the earlier output's continuations
    tree = NgramDrafter(corpus, min_n=2, max_n=4).propose([7, 8, 2, 3], k=6)
    assert sorted(zip(tree.tokens, tree.origins, strict=True)) == [
        (10, "documents"), (11, "documents"), (12, "documents"),
        (20, "outputs"), (21, "outputs"), (22, "outputs"),
    ]  # fmt: skip
    # the context's own match: every token of the chain is the context's
    chain = NgramDrafter(corpus, min_n=2, max_n=4).propose([5, 6, 9, 5, 6], k=3)
    assert chain.tokens == [9, 5, 6] and chain.origins == ["context"] * 3
    # without a tree, the single longest match's origin (the most recent document on a tie)
    single = NgramDrafter(corpus, min_n=2, max_n=4, tree=False).propose([7, 8, 2, 3], k=2)
    assert single.tokens == [20, 21] and single.origins == ["outputs", "outputs"]
    assert NgramDrafter(None).propose([1, 2], 2).origins is None
    corpus.remove_document("@output/0")  # its origin goes with it; the id may come back as a document
    corpus.set_document("@output/0", [1, 2, 3, 30])
    assert NgramDrafter(corpus, min_n=2, max_n=4, tree=False).propose([7, 8, 2, 3], k=1).origins == [
        "documents"
    ]


def test_a_node_shared_by_matches_is_credited_to_the_first_that_reaches_it():
    from completion_engine.drafting.tree import Continuation, candidate_tree

    first = Continuation([4, 5, 6], 3.0, "context")
    later = Continuation([4, 5, 9], 2.0, "documents")
    tokens, parents, origins = candidate_tree([first, later], budget=4)
    assert tokens == [4, 5, 6, 9] and parents == [-1, 0, 1, 1]
    assert origins == ["context", "context", "context", "documents"]


def test_extend_backwards_counts_each_candidates_agreeing_tokens():
    rng = np.random.default_rng(0)
    for _ in range(200):
        sequence = rng.integers(0, 3, size=int(rng.integers(1, 40)))
        tail = rng.integers(0, 3, size=int(rng.integers(0, 10)))
        ends = rng.integers(0, len(sequence), size=int(rng.integers(0, 12)))
        max_n = int(rng.integers(1, 10))
        expected = []
        for end in ends:
            length = 0
            while length < min(max_n, len(tail)) and end - length >= 0:
                if sequence[end - length] != tail[-1 - length]:
                    break
                length += 1
            expected.append(length)
        assert extend_backwards(sequence, ends, tail, max_n).tolist() == expected


def test_ngram_key_is_the_hash_of_the_index():
    rng = np.random.default_rng(1)
    for n in (1, 2, 3, 8):
        tokens = rng.integers(0, 50_000, size=n)
        assert ngram_key(tokens) == ngram_hashes(tokens, n)[0]


def test_documents_indexed_with_their_own_n_gram_length_find_what_they_did():
    # the corpus's n-grams (3) longer than the drafter's shortest match (2): the documents' key is
    # the corpus's; a tail shorter than it finds nothing there, and no error
    corpus = DocumentCorpus(min_n=3)
    corpus.set_document("a", [1, 2, 3, 4, 5, 6, 7])
    drafter = NgramDrafter(corpus, min_n=2, max_n=4)
    assert drafter.propose([9, 2, 3, 4], k=3).tokens == [5, 6, 7]
    assert drafter.propose([3, 4], k=3).tokens == []  # a 2-token tail: shorter than the documents' n-grams
