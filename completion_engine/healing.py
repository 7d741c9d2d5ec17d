"""Token healing: back off the prompt's last token and let the model choose how that text is spelt.

A prompt that ends inside what the tokenizer would merge with the text that follows (a run of
spaces, a half-typed identifier, half of `==`) ends at a token boundary the model never saw in
training: after "        " (8 spaces) it expects the next token to start a word, so it writes
" if ..." and the line gets 9 spaces. Healing removes the last token from the context and
constrains the first generated token(s) to spell the removed text (or start with it):

    prompt "    x = fo"  ->  context "    x =", heal " fo"
    allowed first tokens: " foo", " format", " f" (then "o..."), ...; not " bar", not "\\n"

A heal that ends in indentation also keeps the first token after it from being whitespace: the user
chose the indentation. Greedy decoding then picks the argmax over the allowed tokens; the engine
applies the same mask where the first token is chosen and where drafted tokens are verified, so
speculative output equals plain output under the same constraint. The removed text is not part of
the completion.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


def remaining_heal(heal: str, generated: str) -> str | None:
    """What of `heal` the generated text has still to spell; None once the constraint is over.

    A heal that ends in spaces or tabs (the user typed the indentation) also forbids whitespace right
    after it, so the constraint lasts one token more: "" means "spelt, but no whitespace next".

    >>> remaining_heal("ab", ""), remaining_heal("ab", "a"), remaining_heal("ab", "ab")
    ('ab', 'b', None)
    >>> remaining_heal("    ", "    "), remaining_heal("    ", "    if")
    ('', None)
    """
    if len(generated) < len(heal):
        return heal[len(generated) :]
    if len(generated) == len(heal) and ends_in_blank(heal):
        return ""
    return None


def ends_in_blank(heal: str) -> bool:
    return heal[-1:] in (" ", "\t")


def strip_heal(text: str, heal: str) -> str:
    """The completion without the healed text (empty while the healed text is not spelt yet).

    >>> strip_heal("    return x", "    "), strip_heal("  ", "    ")
    ('return x', '')
    """
    return text[len(heal) :] if text.startswith(heal) else ""


def allowed_tokens(
    token_texts: Sequence[str],
    remaining: str,
    excluded: frozenset[int] = frozenset(),
    no_blank_after: bool = False,
) -> list[int]:
    """Tokens that may come next while `remaining` is still to be spelt: the non-empty ones it starts
    with, and those that start with it (with no_blank_after, not followed by a space or tab).

    >>> allowed_tokens(["a", "ab", "abc", "b", "", "x"], "ab")
    [0, 1, 2]
    >>> allowed_tokens([" ", "  ", "  x", "   ", "x"], "  ", no_blank_after=True)
    [0, 1, 2]
    >>> allowed_tokens([" ", "  x", "x", "\\n"], "", no_blank_after=True)
    [2, 3]
    """
    allowed = []
    for token, text in enumerate(token_texts):
        if not text or token in excluded:
            continue
        if text.startswith(remaining):
            if not (no_blank_after and text[len(remaining) : len(remaining) + 1] in (" ", "\t")):
                allowed.append(token)
        elif remaining.startswith(text):
            allowed.append(token)
    return allowed


def heal_split(
    tokens: Sequence[int], token_texts: Sequence[str], extendable: set[str] | frozenset[str]
) -> tuple[list[int], str]:
    """(context, heal): the last token is backed off when some other token extends its text.

    >>> heal_split([5, 1], ["", "ab", "abc"], {"a", "ab"})
    ([5], 'ab')
    >>> heal_split([5, 2], ["", "ab", "abc"], {"a", "ab"})
    ([5, 2], '')
    """
    if len(tokens) < 2:  # keep at least one token of context
        return list(tokens), ""
    last = tokens[-1]
    text = token_texts[last] if 0 <= last < len(token_texts) else ""
    if text and "\ufffd" not in text and text in extendable:
        return list(tokens[:-1]), text
    return list(tokens), ""


@dataclass(slots=True)
class TokenTable:
    """Each token's text, which texts other tokens extend, and the allowed sets already computed."""

    texts: list[str]  # [vocab]: decoded text of each token alone; "" for special or unused ids
    special: frozenset[int]
    extendable: frozenset[str]  # texts that are a proper prefix of another token's text
    vocabulary: dict[str, int] = field(default_factory=dict)  # token string -> id (special tokens too)
    healable: bool = True  # decoding concatenates token texts (byte-level BPE); else healing is off
    _allowed: dict[tuple[str, bool], list[int]] = field(default_factory=dict)

    @classmethod
    def from_texts(
        cls, texts: list[str], special: frozenset[int] = frozenset(), vocabulary: dict[str, int] | None = None
    ) -> TokenTable:
        texts = ["" if i in special else t for i, t in enumerate(texts)]
        prefixes = {text[:n] for text in texts for n in range(1, len(text))}
        return cls(texts, special, frozenset(prefixes), dict(vocabulary or {}))

    @classmethod
    def from_tokenizer(cls, tokenizer, vocab_size: int) -> TokenTable:
        """Byte-level BPE tokenizers decode a sequence as the concatenation of its tokens' texts."""
        count = min(len(tokenizer), vocab_size)
        texts = tokenizer.batch_decode([[i] for i in range(count)], clean_up_tokenization_spaces=False)
        texts += [""] * (vocab_size - count)
        special = frozenset(int(i) for i in tokenizer.all_special_ids) | frozenset(
            int(i) for i in getattr(tokenizer, "added_tokens_decoder", {})
        )
        table = cls.from_texts(texts, special, tokenizer.get_vocab())
        table.healable = decodes_by_concatenation(tokenizer, texts)
        return table

    def allowed(self, remaining: str, no_blank_after: bool = False) -> list[int]:
        key = (remaining, no_blank_after)
        if key not in self._allowed:
            if len(self._allowed) > 256:
                self._allowed.clear()
            self._allowed[key] = allowed_tokens(self.texts, remaining, self.special, no_blank_after)
        return self._allowed[key]

    def split(self, tokens: Sequence[int]) -> tuple[list[int], str]:
        if not self.healable:
            return list(tokens), ""
        return heal_split(tokens, self.texts, self.extendable)


PROBE = "def f(x):\n    return x.foo(1) + bar  # note\n\tif a == b:\n        pass\n"


def decodes_by_concatenation(tokenizer, texts: Sequence[str]) -> bool:
    """Does a sequence decode to its tokens' texts joined? True for byte-level BPE; SentencePiece
    tokenizers drop the leading space of a sequence's first token, so healing's text matching would
    not hold for them (healing stays off there)."""
    tokens = tokenizer.encode(PROBE, add_special_tokens=False)
    for start in range(len(tokens) - 1):
        pair = tokens[start : start + 2]
        decoded = tokenizer.decode(pair, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        if decoded != "".join(texts[t] for t in pair):
            return False
    return True
