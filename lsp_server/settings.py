"""What the server and each client may set: flags give the defaults, a client's options override them."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from completion_engine.completion import CompletionOptions
from completion_engine.drafters import DRAFT_METHODS
from completion_engine.fim import FIM_CHOICES

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
}
MAX_CROSS_FILE_TOKENS = 2048


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
    return replace(base, **changes)


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
