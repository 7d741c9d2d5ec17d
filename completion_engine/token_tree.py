"""A token tree's shape, from its parents list: path lengths, depth, a node's path.

Shared by what builds trees (drafting), what verifies them (runner, engine) and what checks them
(bench_gpu). A leaf module: the runner imports it, so it imports nothing of ours.

The convention: parents[i] < i is node i's parent, -1 for a node at the top (under the pending
token, or the root of the runner's TreePlan).
"""

from __future__ import annotations

from collections.abc import Sequence


def path_lengths(parents: Sequence[int]) -> list[int]:
    """Each node's root-to-node path length, itself included (parents[i] < i, -1 for a root).

    >>> path_lengths([-1, 0, 1, 0, -1])
    [1, 2, 3, 2, 1]
    """
    lengths: list[int] = []
    for parent in parents:
        lengths.append(1 if parent < 0 else lengths[parent] + 1)
    return lengths


def tree_depth(parents: Sequence[int]) -> int:
    """How many levels a draft tree has below the pending token (parents[i] < i, -1 at the top).

    >>> tree_depth([-1, 0, 1, 0]), tree_depth([-1, -1]), tree_depth([])
    (3, 1, 0)
    """
    return max(path_lengths(parents), default=0)


def path_to(parents: Sequence[int], node: int) -> list[int]:
    """The nodes from a root down to `node`, root first.

    >>> path_to([-1, 0, 1, 0], 2), path_to([-1, 0, 1, 0], 3)
    ([0, 1, 2], [0, 3])
    """
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]
