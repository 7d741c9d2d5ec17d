"""The suggestion cache: which earlier completion answers a request, and the line limits of a completion."""

from completion_engine.completion import CompletionOptions
from completion_engine.stopping import cut_at_line, line_limit
from lsp_server.settings import InvalidOptions, apply_languages, apply_options, language_enabled
from lsp_server.stats import ServerCounters
from lsp_server.suggestions import SuggestionCache, remainder, state_of, typed_since

PREFIX, SUFFIX = "def add(a, b):", "\n\nprint(add(1, 2))\n"
TEXT = "\n    return a + b"


def test_typing_the_start_of_a_suggestion_leaves_the_rest():
    cache = SuggestionCache()
    known = cache.add("a.py", state_of(PREFIX, SUFFIX), TEXT, "ngram", "python")
    for typed in ("", "\n", "\n    ret"):
        prefix = PREFIX + typed
        hit = cache.lookup("a.py", prefix, state_of(prefix, SUFFIX))
        assert hit is not None and hit.suggestion is known and hit.text == TEXT[len(typed) :]


def test_any_other_state_is_a_miss():
    cache = SuggestionCache()
    cache.add("a.py", state_of(PREFIX, SUFFIX), TEXT, "ngram", "python")
    misses = [
        ("a.py", PREFIX + "\n    x", SUFFIX),  # typed something else
        ("a.py", PREFIX + TEXT, SUFFIX),  # typed all of it: nothing left to suggest
        ("a.py", PREFIX + "\n", SUFFIX + "#"),  # the text after the cursor changed
        ("a.py", "# " + PREFIX + "\n", SUFFIX),  # an edit above the cursor
        ("b.py", PREFIX + "\n", SUFFIX),  # another document
    ]
    for uri, prefix, suffix in misses:
        assert cache.lookup(uri, prefix, state_of(prefix, suffix)) is None, (uri, prefix, suffix)
    assert cache.lookup("a.py", PREFIX, state_of(PREFIX, SUFFIX, inputs_hash=1)) is None  # other settings


def test_the_cache_keeps_the_newest_and_replaces_a_state_it_has():
    cache = SuggestionCache(size=2)
    first = cache.add("a.py", state_of("a", ""), "bc", "ngram", "python")
    cache.add("a.py", state_of("a", ""), "bd", "ngram", "python")
    assert cache.get(first.id) is None and len(cache) == 1
    cache.add("a.py", state_of("x", ""), "y1", "ngram", "python")
    cache.add("a.py", state_of("z", ""), "y2", "ngram", "python")
    assert cache.lookup("a.py", "a", state_of("a", "")) is None and len(cache) == 2
    cache.forget("a.py")
    assert len(cache) == 0


def test_typed_since_and_remainder():
    known = state_of("x = ", "\n")
    assert typed_since(known, "x = ", state_of("x = ", "\n")) == ""
    assert typed_since(known, "x", state_of("x", "\n")) is None  # deleted back past the cursor
    assert remainder("abc", "") == "abc" and remainder("abc", "abc") is None


def test_suggestion_counters_give_the_accept_rate_by_draft_and_language():
    counters = ServerCounters()
    for _ in range(4):
        counters.count_suggestion("shown", "ngram", "python")
    counters.count_suggestion("shown", "hybrid", "rust")
    counters.count_suggestion("accepted", "ngram", "python")
    counters.count_suggestion("partially_accepted", "hybrid", "rust", chars=5)
    counters.count_suggestion("", "hybrid", "rust", chars=3)
    suggestions = counters.snapshot()["suggestions"]
    assert (suggestions["shown"], suggestions["accepted"], suggestions["accept_rate"]) == (5, 1, 0.2)
    assert suggestions["partially_accepted"] == 1 and suggestions["partially_accepted_chars"] == 8
    assert suggestions["by_draft"]["ngram"]["accept_rate"] == 0.25
    assert suggestions["by_language"]["rust"] == {
        "shown": 1,
        "accepted": 0,
        "partially_accepted": 1,
        "partially_accepted_chars": 8,
        "accept_rate": 0.0,
    }


def test_line_limits():
    # auto: multi-line at an empty line or after a block opener, else the rest of the line
    assert line_limit("auto", 0, "def f(a):", "\n") == 0
    assert line_limit("auto", 3, "    ", "\n") == 3
    assert line_limit("auto", 3, "x = compute(", ")") == 3
    assert line_limit("auto", 3, "x = comp", "\n") == 1
    assert line_limit("single", 0, "def f(a):", "") == 1
    assert line_limit("multi", 0, "x = comp", "") == 0
    # the cut is the same whether the text comes at once or grows
    cut = cut_at_line(2)
    text = "a = 1\nb = 2\nc = 3"
    assert cut(text) == len("a = 1\nb = 2")
    second_break = len("a = 1\nb = 2")
    assert [cut(text[:n]) for n in range(len(text) + 1)] == [None] * (second_break + 1) + [second_break] * (
        len(text) - second_break
    )


def test_lines_and_languages_options():
    options = CompletionOptions()
    changed = apply_options(options, {"lines": "auto", "maxLines": 4})
    assert (changed.lines, changed.max_lines) == ("auto", 4)
    for bad in ({"lines": "some"}, {"maxLines": -1}, {"maxLines": True}, {"languages": ["python"]}):
        try:
            apply_options(options, bad)
            apply_languages({}, bad)
        except InvalidOptions:
            continue
        raise AssertionError(f"{bad} was accepted")
    languages = apply_languages({}, {"languages": {"*": False, "python": True}})
    assert language_enabled(languages, "python") and not language_enabled(languages, "markdown")


def test_the_server_counts_drafted_tokens_by_origin():
    from completion_engine.types import SourceStats, Stats

    counters = ServerCounters()
    for accepted in (3, 1):
        stats = Stats()
        stats.by_origin = {"documents": SourceStats(4, accepted, 2), "model": SourceStats(2, 0, 1)}
        counters.record(stats, "a.py", cancelled=False)
    assert counters.snapshot()["by_origin"] == {
        "documents": {"drafted": 8, "accepted": 4, "acceptance": 0.5},
        "model": {"drafted": 4, "accepted": 0, "acceptance": 0.0},
    }
