"""A candidate tree: several continuations merged into one token tree that fits a verify block.

Several earlier occurrences of the context's tail (in the context, the open documents) often go on
differently. A single chain bets on one; a tree verifies the likely ones together in one forward
(runner.verify_tree), and greedy acceptance follows whichever branch the target agrees with.

Policy: the continuations are merged into a trie, each weighted by its match length (a longer
match predicts better). A node's estimated chance of being accepted is

    P(node) = P(parent) * share(node) * DECAY

where share is the node's weight over its siblings' total: unanimous continuations make a deep
chain, disagreeing ones a wide, shallow tree. The `budget` nodes with the highest P are kept
(best first, so a parent always comes before its children); the expected accepted length is the
sum of P over the kept nodes, which this choice maximises for the estimate.

Worked example (budget 4): continuations [5, 6, 7] (weight 3) and [5, 8] (weight 1) give
5 (P 0.8), then 6 (0.8 * 0.75 * 0.8 = 0.48), 7 (0.38), 8 (0.16): tokens [5, 6, 7, 8],
parents [-1, 0, 1, 0].

Each node is credited to the origin (context, documents, outputs) of the first continuation that
reaches it: the callers pass the longest matches first, the context's before the documents'.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from completion_engine.types import CONTEXT

DECAY = 0.8  # the chance that the target goes on agreeing one more token, all candidates agreeing


@dataclass(frozen=True, slots=True)
class Continuation:
    tokens: Sequence[int]  # what followed one earlier occurrence of the tail
    weight: float  # how much to believe it (its match length)
    origin: str = CONTEXT  # where the match was: CONTEXT, DOCUMENTS or OUTPUTS


def candidate_tree(
    continuations: Sequence[Continuation], budget: int
) -> tuple[list[int], list[int], list[str]]:
    """(tokens, parents, origins) of the kept nodes; parents[i] is an earlier index, or -1 under the root.

    >>> candidate_tree([Continuation([5, 6, 7], 3.0), Continuation([5, 8], 1.0, "documents")], budget=4)
    ([5, 6, 7, 8], [-1, 0, 1, 0], ['context', 'context', 'context', 'documents'])
    >>> candidate_tree([Continuation([1, 2], 2.0), Continuation([3], 2.0)], budget=2)
    ([1, 3], [-1, -1], ['context', 'context'])
    """
    # the trie: node -> (token, parent node, weight, origin); node 0 is the root
    trie_tokens, trie_parents, weights, origins = [-1], [-1], [0.0], [CONTEXT]
    children: list[dict[int, int]] = [{}]
    for continuation in continuations:
        node = 0
        weights[0] += continuation.weight
        for token in continuation.tokens:
            token = int(token)
            child = children[node].get(token)
            if child is None:
                child = len(trie_tokens)
                trie_tokens.append(token)
                trie_parents.append(node)
                weights.append(0.0)
                origins.append(continuation.origin)
                children.append({})
                children[node][token] = child
            weights[child] += continuation.weight
            node = child
    kept: list[int] = []
    index_of = {0: -1}
    frontier = [(-DECAY * weights[c] / weights[0], c) for c in children[0].values()] if weights[0] else []
    heapq.heapify(frontier)
    while frontier and len(kept) < budget:
        negative_p, node = heapq.heappop(frontier)
        index_of[node] = len(kept)
        kept.append(node)
        for child in children[node].values():
            heapq.heappush(frontier, (negative_p * DECAY * weights[child] / weights[node], child))
    return (
        [trie_tokens[n] for n in kept],
        [index_of[trie_parents[n]] for n in kept],
        [origins[n] for n in kept],
    )


def first_chain(parents: Sequence[int]) -> list[int]:
    """The nodes of the tree's first root-to-leaf chain (first child each time): a chain for
    chain-only verifiers.

    >>> first_chain([-1, 0, 1, 0])  # tokens [5, 6, 7, 8]: the chain [5, 6, 7]
    [0, 1, 2]
    """
    chain: list[int] = []
    node = -1
    for index, parent in enumerate(parents):
        if parent == node:
            chain.append(index)
            node = index
    return chain
