"""Pure text helpers: the prompt window, the fallback stop, results, settings, percentiles."""

import pytest
from lsprotocol import types

from completion_engine.completion import CompletionOptions
from completion_engine.prompt import prompt_window, stable_tail
from completion_engine.stopping import fallback_stop, indentation, stop_policy
from lsp_server.results import completion_result, inline_result, word_before
from lsp_server.settings import InvalidOptions, apply_options
from lsp_server.stats import percentile


def test_prompt_window_start_stays_put_while_typing():
    prefix = "".join(f"line {i}\n" for i in range(2000))
    starts = {len(prefix + "x" * n) - len(prompt_window(prefix + "x" * n, 4000, 1024)) for n in range(50)}
    assert len(starts) == 1
    window = prompt_window(prefix, 4000, 1024)
    assert window.startswith("line ") and 4000 <= len(window) <= 4000 + 1024


def test_stable_tail_drops_whole_steps():
    assert stable_tail(list(range(10)), 10) == list(range(10))
    assert stable_tail(list(range(11)), 10, step=4) == list(range(4, 11))
    assert stable_tail(list(range(12)), 10, step=4) == list(range(4, 12))  # same start one token later


@pytest.mark.parametrize(
    "completion, indent, keep",
    [
        ("x = 1\n\ny = 2", 0, 5),  # blank line
        ("x)\n    y = 2\nz = 3", 4, 12),  # dedent below the cursor's indentation
        ("a\n    b", 4, None),  # still inside the block
        ("a\n   ", 4, None),  # a last line of only whitespace is not judged yet
        ("a\n  \n", 0, 1),  # a whitespace-only line is blank
        ("\n\n", 0, 0),
    ],
)
def test_fallback_stop(completion, indent, keep):
    assert fallback_stop(completion, indent) == keep


def test_policy_off_keeps_the_raw_completion():
    raw = stop_policy("def f():\n    ", "", "python", "/x.py", syntax=False)
    assert raw.stop_at is None and raw.finalize("a\n\nb ") == "a\n\nb "
    on = stop_policy("def f():\n    ", "", "python", "/x.py", syntax=True)
    assert on.stop_at is not None
    assert indentation("    ") == 4


def test_results_carry_the_same_text():
    position = types.Position(line=3, character=9)
    inline = inline_result("bar()", position)
    assert inline.items[0].insert_text == "bar()"
    assert inline_result("", position).items == []
    completion = completion_result("bar()\n", "    x = foo", position, "utf-16")
    (item,) = completion.items
    assert item.text_edit.new_text == "foo" + "bar()\n"
    assert item.text_edit.range.start == types.Position(line=3, character=6)
    assert item.label == "foobar()"
    assert word_before("a.b_c1") == "b_c1"


def test_options_override_settings_and_bad_values_say_what_is_accepted():
    settings = apply_options(CompletionOptions(), {"draft": "none", "maxNewTokens": 8, "temperature": 0.5})
    assert (settings.draft, settings.max_new_tokens, settings.temperature) == ("none", 8, 0.5)
    assert apply_options(settings, None) is settings
    assert apply_options(settings, {"unknown": 1}) == settings
    for bad, word in [
        ({"draft": "magic"}, "draft"),
        ({"maxNewTokens": 0}, "maxNewTokens"),
        ({"maxNewTokens": True}, "maxNewTokens"),
        ({"temperature": float("nan")}, "temperature"),
        ({"syntax": "yes"}, "syntax"),
        ([1], "object"),
    ]:
        with pytest.raises(InvalidOptions, match=word):
            apply_options(settings, bad)


def test_percentile_nearest_rank():
    assert percentile([], 0.5) is None
    assert percentile([1.0], 0.95) == 1.0
    assert percentile([float(i) for i in range(1, 101)], 0.95) == 95.0


def test_fim_and_cross_file_options():
    settings = apply_options(CompletionOptions(), {"fim": "off", "crossFileTokens": 256, "healing": False})
    assert (settings.fim, settings.cross_file_tokens, settings.healing) == ("off", 256, False)
    for bad in ({"fim": "fancy"}, {"crossFileTokens": -1}, {"crossFileTokens": True}, {"healing": "yes"}):
        with pytest.raises(InvalidOptions):
            apply_options(CompletionOptions(), bad)
