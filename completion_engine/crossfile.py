"""Context from other open files: the snippets most related to the code around the cursor.

In the spirit of llama.vim's ring of chunks and Tabby's declarations: other open documents are cut
into chunks of lines; a chunk's score is the Jaccard overlap of its identifiers with those of the
cursor's neighbourhood; the best chunks fill a character budget. They go first in the prompt, in
the model's repository format (`<file_sep>path\\ncode`), each file's chunks in file order.

KV cache: the snippets come before everything else, so a change of selection re-prefills the whole
prompt. The neighbourhood therefore ends at the last line boundary that is a multiple of
NEIGHBOURHOOD_STEP lines, and does not change while the user types within those lines.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Iterable
from dataclasses import dataclass

CHUNK_LINES = 16
NEIGHBOURHOOD_LINES = 32
NEIGHBOURHOOD_STEP = 8
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")
COMMON_WORDS = frozenset(keyword.kwlist) | {"self", "cls", "function", "const", "return", "var", "let"}
# repository formats: the separator token each tokenizer knows, in order of preference
REPO_SEPARATORS = ("<|file_sep|>", "<file_sep>")


@dataclass(frozen=True, slots=True)
class Snippet:
    path: str
    start_line: int  # 0-based
    text: str
    score: float


def identifiers(text: str) -> set[str]:
    """Names of three characters or more, keywords and `self` left out.

    >>> sorted(identifiers("def area(self, r): return math.pi * r ** 2"))
    ['area', 'math']
    """
    return set(_IDENTIFIER.findall(text)) - COMMON_WORDS


def neighbourhood(prefix: str) -> str:
    """The lines before the cursor's line, ending at a multiple of NEIGHBOURHOOD_STEP lines.

    >>> neighbourhood("".join(f"l{i}\\n" for i in range(11)) + "cur").splitlines()[-1]
    'l7'
    """
    lines = prefix.split("\n")[:-1]
    end = len(lines) // NEIGHBOURHOOD_STEP * NEIGHBOURHOOD_STEP
    return "\n".join(lines[max(0, end - NEIGHBOURHOOD_LINES) : end])


def chunks(path: str, text: str, size: int = CHUNK_LINES) -> list[tuple[str, int, str]]:
    lines = text.split("\n")
    return [(path, start, "\n".join(lines[start : start + size])) for start in range(0, len(lines), size)]


def select_snippets(near: str, documents: Iterable[tuple[str, str]], budget_chars: int) -> list[Snippet]:
    """The best-scoring chunks within the budget, ordered by path and line (a stable prompt).

    >>> docs = [("a.py", "def area(r):\\n    return r"), ("b.py", "import os\\nos.walk('.')")]
    >>> [s.path for s in select_snippets("x = area(radius)", docs, 100)]
    ['a.py']
    """
    wanted = identifiers(near)
    if not wanted or budget_chars <= 0:
        return []
    scored = []
    for path, text in documents:
        for chunk_path, start, chunk in chunks(path, text):
            found = identifiers(chunk)
            shared = len(found & wanted)
            if shared:
                scored.append(Snippet(chunk_path, start, chunk, shared / len(found | wanted)))
    scored.sort(key=lambda s: (-s.score, s.path, s.start_line))
    chosen, used = [], 0
    for snippet in scored:
        if used + len(snippet.text) > budget_chars:
            continue
        chosen.append(snippet)
        used += len(snippet.text)
    return sorted(chosen, key=lambda s: (s.path, s.start_line))


def repo_separator(vocabulary: Iterable[str]) -> str | None:
    known = set(vocabulary)
    return next((sep for sep in REPO_SEPARATORS if sep in known), None)


def render_files(snippets: list[Snippet], separator: str, current_path: str) -> str:
    """The snippets as files of one repository, then the current file's header.

    >>> render_files([Snippet("a.py", 0, "x = 1", 1.0)], "<file_sep>", "b.py")
    '<file_sep>a.py\\nx = 1\\n<file_sep>b.py\\n'
    """
    parts = []
    for path in dict.fromkeys(s.path for s in snippets):
        body = "\n...\n".join(s.text for s in snippets if s.path == path)
        parts.append(f"{separator}{path}\n{body}\n")
    parts.append(f"{separator}{current_path}\n")
    return "".join(parts)
