"""What the server and each client may set: flags give the defaults, a client's options override them."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from completion_engine.completion import CompletionOptions
from completion_engine.drafters import DRAFT_METHODS
from completion_engine.fim import FIM_CHOICES
from completion_engine.stopping import LINE_MODES

MAX_NEW_TOKENS_CAP = 4096  # the engine's cache has room for about this many generated tokens


class InvalidOptions(ValueError):
    """A client's options could not be used; the message names the key and what it accepts."""


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """Bounds that keep one server's memory and latency in check, whatever its clients send."""

    queue_size: int = 16  # completion requests waiting for the model worker, all clients together
    max_document_bytes: int = 2 * 1024 * 1024  # larger documents are refused (and the client told)
    max_client_bytes: int = 64 * 1024 * 1024  # open documents of one client, all together, URIs included
    max_documents: int = 1000  # documents one client may have open
    max_changes: int = 1000  # content changes in one didChange
    corpus_tokens: int = 1_000_000  # tokens of open documents in the n-gram corpus; oldest go first
    max_clients: int = 32  # WebSocket connections at once
    max_message_bytes: int = 8 * 1024 * 1024  # one JSON-RPC message; larger ones are dropped unread


# initializationOptions key -> CompletionOptions field (the engine's one options record)
OPTION_FIELDS = {
    "draft": "draft",
    "maxNewTokens": "max_new_tokens",
    "temperature": "temperature",
    "syntax": "syntax",
    "healing": "healing",
    "fim": "fim",
    "crossFileTokens": "cross_file_tokens",
    "lines": "lines",
    "maxLines": "max_lines",
}
MAX_CROSS_FILE_TOKENS = 2048
MAX_LINES_CAP = 1000


def apply_options(base: CompletionOptions, options: object) -> CompletionOptions:
    """The options with a client's options applied; unknown keys are ignored, bad values raise.

    >>> apply_options(CompletionOptions(), {"maxNewTokens": 16, "syntax": False}).max_new_tokens
    16
    """
    if options is None:
        return base
    if not isinstance(options, dict):
        raise InvalidOptions(
            f"options must be an object with keys {', '.join(OPTION_FIELDS)}, not {options!r:.80}"
        )
    changes: dict[str, object] = {}
    if "draft" in options and options["draft"] is not None:
        changes["draft"] = _draft(options["draft"])
    if "maxNewTokens" in options and options["maxNewTokens"] is not None:
        changes["max_new_tokens"] = _max_new_tokens(options["maxNewTokens"])
    if "temperature" in options and options["temperature"] is not None:
        changes["temperature"] = _temperature(options["temperature"])
    if "syntax" in options and options["syntax"] is not None:
        if not isinstance(options["syntax"], bool):
            raise InvalidOptions(f"syntax must be true or false, not {options['syntax']!r:.40}")
        changes["syntax"] = options["syntax"]
    if "healing" in options and options["healing"] is not None:
        if not isinstance(options["healing"], bool):
            raise InvalidOptions(f"healing must be true or false, not {options['healing']!r:.40}")
        changes["healing"] = options["healing"]
    if "fim" in options and options["fim"] is not None:
        if options["fim"] not in FIM_CHOICES:
            raise InvalidOptions(f"fim must be one of {', '.join(FIM_CHOICES)}, not {options['fim']!r:.40}")
        changes["fim"] = options["fim"]
    if "crossFileTokens" in options and options["crossFileTokens"] is not None:
        value = options["crossFileTokens"]
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_CROSS_FILE_TOKENS:
            raise InvalidOptions(
                f"crossFileTokens must be an integer from 0 to {MAX_CROSS_FILE_TOKENS}, not {value!r:.40}"
            )
        changes["cross_file_tokens"] = value
    if "lines" in options and options["lines"] is not None:
        if options["lines"] not in LINE_MODES:
            choices = ", ".join(LINE_MODES)
            raise InvalidOptions(f"lines must be one of {choices}, not {options['lines']!r:.40}")
        changes["lines"] = options["lines"]
    if "maxLines" in options and options["maxLines"] is not None:
        value = options["maxLines"]
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_LINES_CAP:
            raise InvalidOptions(f"maxLines must be an integer from 0 to {MAX_LINES_CAP}, not {value!r:.40}")
        changes["max_lines"] = value
    return replace(base, **changes)


def apply_languages(base: dict[str, bool], options: object) -> dict[str, bool]:
    """The client's `languages` option (language id -> enabled; "*" for the rest) over `base`.

    >>> apply_languages({"*": True}, {"languages": {"markdown": False}})
    {'markdown': False}
    """
    if not isinstance(options, dict) or options.get("languages") is None:
        return base
    languages = options["languages"]
    if not isinstance(languages, dict) or not all(
        isinstance(name, str) and isinstance(on, bool) for name, on in languages.items()
    ):
        raise InvalidOptions(
            f'languages must map language ids to true or false (e.g. {{"*": true, "markdown": false}}), '
            f"not {languages!r:.60}"
        )
    return dict(languages)


def language_enabled(languages: dict[str, bool], language_id: str) -> bool:
    """Whether completions are wanted in a language ("*" covers those not listed; default on).

    >>> language_enabled({"*": False, "python": True}, "python"), language_enabled({}, "go")
    (True, True)
    """
    return languages.get(language_id, languages.get("*", True))


def _draft(value: object) -> str:
    if value not in DRAFT_METHODS:
        raise InvalidOptions(f"draft must be one of {', '.join(DRAFT_METHODS)}, not {value!r:.40}")
    return str(value)


def _max_new_tokens(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_NEW_TOKENS_CAP:
        raise InvalidOptions(
            f"maxNewTokens must be an integer from 1 to {MAX_NEW_TOKENS_CAP}, not {value!r:.40}"
        )
    return value


def _temperature(value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 <= value <= 5
    ):
        raise InvalidOptions(f"temperature must be a number from 0 to 5, not {value!r:.40}")
    return float(value)
