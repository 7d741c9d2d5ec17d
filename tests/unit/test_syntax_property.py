"""Property: whatever the checker returns, prefix + text + suffix has no more ERROR/MISSING nodes than
prefix + suffix (fresh parse of the whole file), for any cursor and any completion."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_syntax_checker import SNIPPETS, file_errors

from completion_engine.syntax import SyntaxChecker

DOCUMENTS = {s.language: s.document.replace("<|>", "") + s.closes.split("\n\n")[-1] + "\n" for s in SNIPPETS}
JUNK = st.text(alphabet="(){}[];:,.=+<>\"'`#/ \n\tabcxyz019", max_size=40)


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, str, str, str]:
    """(language, prefix, suffix, completion): a cursor anywhere, a completion made of code from the same file
    (often the text right after the cursor: repeats) and junk."""
    language = draw(st.sampled_from(sorted(DOCUMENTS)))
    document = DOCUMENTS[language]
    cursor = draw(st.integers(0, len(document)))
    start = draw(st.integers(0, len(document)))
    code = document[start : start + draw(st.integers(0, 160))]
    completion = draw(st.sampled_from(["", "code", "junk"]))
    pieces = {"": code, "code": code + draw(JUNK), "junk": draw(JUNK) + code}
    return language, document[:cursor], document[cursor:], pieces[completion]


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_finalize_never_adds_parse_errors(request: tuple[str, str, str, str]) -> None:
    language, prefix, suffix, completion = request
    checker = SyntaxChecker(prefix, suffix, language)
    final = checker.finalize(completion)
    assert completion.startswith(final)
    assert file_errors(language, prefix + final + suffix) <= file_errors(language, prefix + suffix)


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_streaming_answers_are_prefixes_of_the_completion(request: tuple[str, str, str, str]) -> None:
    language, prefix, suffix, completion = request
    checker = SyntaxChecker(prefix, suffix, language)
    stop = checker.stop_at(completion)
    assert stop is None or 0 <= stop <= len(completion)
    assert completion.startswith(checker.visible(completion))
