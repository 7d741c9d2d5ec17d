"""Fill-in-the-middle prompts per model family, detected from the tokenizer's special tokens.

A code model trained for FIM sees the code after the cursor too. Each family spells it its own way:

    qwen2.5-coder   <|fim_prefix|>P<|fim_suffix|>S<|fim_middle|>
    starcoder       <fim_prefix>P<fim_suffix>S<fim_middle>       (StarCoder, StarCoder2; SPM below)
    santacoder      <fim-prefix>P<fim-suffix>S<fim-middle>
    deepseek-coder  <｜fim▁begin｜>P<｜fim▁hole｜>S<｜fim▁end｜>
    codellama       <PRE> P <SUF>S <MID>                          (SPM below)
    codestral       [SUFFIX]S[PREFIX]P

Order and the KV cache: typing at the cursor changes the prefix at its end and leaves the suffix
alone. In PSM order (prefix, suffix, middle) every keystroke recomputes the suffix's tokens after
the edit; in SPM order (suffix first) only the last few prefix tokens. So families trained on SPM
(StarCoder, SantaCoder and CodeLlama were trained on both; Codestral only knows it) use SPM, and
PSM-only families (Qwen2.5-Coder, DeepSeek-Coder) get a small suffix budget, which bounds the
re-prefill after an edit. A tokenizer without FIM tokens (the embedded SmolLM2) gets no FIM.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

PREFIX, SUFFIX = "{prefix}", "{suffix}"  # placeholders in a template


@dataclass(frozen=True, slots=True)
class FimFormat:
    """A family's FIM template: special-token strings, literal text and the two placeholders."""

    name: str
    template: tuple[str, ...]  # parts in order; special tokens are listed in `special`
    special: tuple[str, ...]  # the template's special-token strings (all must be in the vocabulary)
    stop_tokens: tuple[str, ...] = ()  # tokens that end the middle (besides the model's EOS)
    order: str = "psm"  # "psm" | "spm": where the suffix sits (for the KV cache argument above)

    def render(self, prefix: str, suffix: str) -> str:
        """The prompt as text (for reading and tests; requests are built part by part).

        >>> FIM_FORMATS["starcoder"].render("def f(", "):")
        '<fim_prefix><fim_suffix>):<fim_middle>def f('
        >>> FIM_FORMATS["qwen2.5-coder"].render("a", "b")
        '<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>'
        """
        return "".join(prefix if p == PREFIX else suffix if p == SUFFIX else p for p in self.template)

    def tokens(
        self,
        prefix_tokens: list[int],
        suffix_tokens: list[int],
        token_id: Callable[[str], int],
        encode: Callable[[str], list[int]],
    ) -> list[int]:
        """The prompt's token ids: special tokens by id, literal text encoded, the parts as given."""
        ids: list[int] = []
        for part in self.template:
            if part == PREFIX:
                ids += prefix_tokens
            elif part == SUFFIX:
                ids += suffix_tokens
            elif part in self.special:
                ids.append(token_id(part))
            else:
                ids += encode(part)
        return ids


def _psm(name: str, pre: str, suf: str, mid: str, stops: tuple[str, ...] = ()) -> FimFormat:
    return FimFormat(name, (pre, PREFIX, suf, SUFFIX, mid), (pre, suf, mid), stops, "psm")


def _spm(name: str, pre: str, suf: str, mid: str, stops: tuple[str, ...] = ()) -> FimFormat:
    # StarCoder's SPM variant keeps the prefix sentinel first: <fim_prefix><fim_suffix>S<fim_middle>P
    return FimFormat(name, (pre, suf, SUFFIX, mid, PREFIX), (pre, suf, mid), stops, "spm")


FIM_FORMATS: dict[str, FimFormat] = {
    f.name: f
    for f in (
        _psm(
            "qwen2.5-coder",
            "<|fim_prefix|>",
            "<|fim_suffix|>",
            "<|fim_middle|>",
            ("<|fim_pad|>", "<|endoftext|>", "<|file_sep|>", "<|repo_name|>"),
        ),
        _spm("starcoder", "<fim_prefix>", "<fim_suffix>", "<fim_middle>", ("<fim_pad>", "<file_sep>")),
        _spm("santacoder", "<fim-prefix>", "<fim-suffix>", "<fim-middle>", ("<fim-pad>",)),
        _psm("deepseek-coder", "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
        # CodeLlama SPM: "<PRE> <SUF>S <MID> P" (Meta's infilling code); the spaces are literal text
        FimFormat(
            "codellama",
            ("<PRE>", " ", "<SUF>", SUFFIX, " ", "<MID>", " ", PREFIX),
            ("<PRE>", "<SUF>", "<MID>"),
            ("<EOT>",),
            "spm",
        ),
        FimFormat("codestral", ("[SUFFIX]", SUFFIX, "[PREFIX]", PREFIX), ("[SUFFIX]", "[PREFIX]"), (), "spm"),
    )
}
FIM_CHOICES = ("auto", "off", *FIM_FORMATS)


def detect_fim(vocabulary: Iterable[str]) -> FimFormat | None:
    """The first family whose special tokens are all in the vocabulary (SentencePiece's "▁<PRE>" too).

    >>> detect_fim(["<fim_prefix>", "<fim_suffix>", "<fim_middle>", "a"]).name
    'starcoder'
    >>> detect_fim(["<file_sep>", "<filename>"]) is None
    True
    """
    known = set(vocabulary)
    for fim in FIM_FORMATS.values():
        if all(token in known or "▁" + token in known for token in fim.special):
            return fim
    return None


def choose_fim(setting: str, vocabulary: Iterable[str]) -> FimFormat | None:
    """ "auto": detect; "off": none; a family name: that family (ValueError if unknown)."""
    if setting == "off":
        return None
    if setting == "auto":
        return detect_fim(vocabulary)
    if setting not in FIM_FORMATS:
        raise ValueError(f"unknown FIM format {setting!r}; choose one of {', '.join(FIM_CHOICES)}")
    return FIM_FORMATS[setting]


def suffix_window(suffix: str, max_chars: int) -> str:
    """The start of the suffix, up to max_chars, cut at a line end (it does not move while typing).

    >>> suffix_window("a\\nbb\\nccc\\n", 6)
    'a\\nbb\\n'
    """
    if len(suffix) <= max_chars:
        return suffix
    cut = suffix.rfind("\n", 0, max_chars)
    return suffix[: cut + 1] if cut >= 0 else suffix[:max_chars]
