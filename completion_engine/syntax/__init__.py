"""Syntax checks for streamed completions: when to stop, what to show, what to insert (issue #4).

    from completion_engine.syntax import detect_language, SyntaxChecker
    checker = SyntaxChecker(prefix, suffix, detect_language(language_id, path))
    checker.stop_at(text)    # None, or n: stop generating and keep text[:n]
    checker.visible(text)    # what is safe to show while streaming
    checker.finalize(text)   # what to insert: no new parse errors, no repeat of the suffix

Modules: languages (names, grammars, lexical facts), lexer (brackets outside strings and comments),
window (the small stand-in document that is parsed per check), judges (error counts), rules (the stop rules,
pure functions), checker (the stateful wrapper).
"""

from completion_engine.syntax.checker import SyntaxChecker, SyntaxConfig, truncation_points
from completion_engine.syntax.languages import SPECS, detect_language
from completion_engine.syntax.rules import Stop

LANGUAGES = tuple(SPECS)

__all__ = ["LANGUAGES", "Stop", "SyntaxChecker", "SyntaxConfig", "detect_language", "truncation_points"]
