"""The languages the checker knows: how to recognise them, how their text is lexed, which grammar parses them.

Grammars come from the per-language PyPI wheels (tree-sitter-python, ...), imported lazily. A language whose
wheel is missing still gets the lexical (indentation and bracket) rules.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from functools import cache
from pathlib import PurePath

from tree_sitter import Language, Parser


@dataclass(frozen=True, slots=True)
class Lexicon:
    """What the bracket scanner must skip: comments and string literals."""

    line_comments: tuple[str, ...]
    block_comment: tuple[str, str] | None
    quotes: tuple[str, ...]  # string delimiters, longest first ('"""' before '"')
    multiline_quotes: frozenset[str]  # delimiters whose strings may span lines; the others end at a newline
    char_quote: bool = False  # "'" opens only a one-character literal ('a', '\n'); else a lifetime/label


@dataclass(frozen=True, slots=True)
class LanguageSpec:
    name: str
    lexicon: Lexicon
    indent_sensitive: bool  # a dedent ends a block (Python, and the unknown-language fallback)
    definition_start: re.Pattern[str]  # a column-0 line that starts a new top-level definition
    attached_start: tuple[
        str, ...
    ]  # decorator / attribute / comment lines that belong to the line below them
    comment_start: tuple[str, ...]  # lines that never end a block by their indentation
    continuation_start: re.Pattern[str]  # a line that continues the statement above (else, except, catch)
    dedent_exempt: re.Pattern[str] | None  # column-0 lines that do not leave a block (preprocessor, labels)
    containers: frozenset[
        str
    ]  # node types whose children are whole statements or members, one or more lines each
    grammar: tuple[str, str] | None  # (module, function) returning the tree-sitter language


_C_LEXICON = Lexicon(("//",), ("/*", "*/"), ('"', "'"), frozenset(), char_quote=True)
_JS_LEXICON = Lexicon(("//",), ("/*", "*/"), ("`", '"', "'"), frozenset({"`"}))
_JS_DEFINITION = r"(export|function|class|async\s+function)\b|@"
_TS_DEFINITION = _JS_DEFINITION + r"|(interface|enum|namespace|declare|abstract\s+class)\b|type\s+\w"
# A C-family function header: a type, a name, "(" ("int main(", "std::vector<int> f("), not a statement.
_FUNCTION_HEADER = (
    r"(?!(return|throw|new|else|case|delete|goto|co_return|co_yield)\b)"
    r"[A-Za-z_][\w<>\[\],.?*&:\s]*[\s*&]~?[A-Za-z_]\w*\s*\("
)
_C_DEFINITION = r"(static|extern|inline|struct|union|enum|typedef)\b|" + _FUNCTION_HEADER
_ELSE = re.compile(r"(else|catch|finally)\b")
_LABEL_OR_DIRECTIVE = re.compile(r"#|\w+:\s*($|//)")
_JS_CONTAINERS = frozenset({"program", "statement_block", "class_body", "switch_body", "object", "array"})


def _spec(
    name: str,
    lexicon: Lexicon,
    definition: str,
    attached: tuple[str, ...],
    containers: set[str],
    grammar: tuple[str, str] | None,
    indent_sensitive: bool = False,
    continuation: re.Pattern[str] = _ELSE,
    dedent_exempt: re.Pattern[str] | None = None,
) -> LanguageSpec:
    comments = lexicon.line_comments + ((lexicon.block_comment[0], "*") if lexicon.block_comment else ())
    return LanguageSpec(
        name=name,
        lexicon=lexicon,
        indent_sensitive=indent_sensitive,
        definition_start=re.compile(definition),
        attached_start=attached,
        comment_start=comments,
        continuation_start=continuation,
        dedent_exempt=dedent_exempt,
        containers=frozenset(containers),
        grammar=grammar,
    )


SPECS: dict[str, LanguageSpec] = {
    spec.name: spec
    for spec in (
        _spec(
            "python",
            Lexicon(("#",), None, ('"""', "'''", '"', "'"), frozenset({'"""', "'''"})),
            r"(async\s+def|def|class)\b|@",
            ("@", "#"),
            {"module", "block", "dictionary", "list", "set", "tuple", "argument_list"},
            ("tree_sitter_python", "language"),
            indent_sensitive=True,
            continuation=re.compile(r"(else|elif|except|finally)\b"),
        ),
        _spec(
            "javascript",
            _JS_LEXICON,
            _JS_DEFINITION,
            ("@", "//", "/*", "*"),
            set(_JS_CONTAINERS),
            ("tree_sitter_javascript", "language"),
        ),
        _spec(
            "typescript",
            _JS_LEXICON,
            _TS_DEFINITION,
            ("@", "//", "/*", "*"),
            _JS_CONTAINERS | {"interface_body", "object_type", "enum_body"},
            ("tree_sitter_typescript", "language_typescript"),
        ),
        _spec(
            "tsx",
            _JS_LEXICON,
            _TS_DEFINITION,
            ("@", "//", "/*", "*"),
            _JS_CONTAINERS | {"interface_body", "object_type", "enum_body"},
            ("tree_sitter_typescript", "language_tsx"),
        ),
        _spec(
            "go",
            Lexicon(("//",), ("/*", "*/"), ("`", '"', "'"), frozenset({"`"}), char_quote=True),
            r"(func|type)\b",
            ("//", "/*", "*"),
            {"source_file", "block", "statement_list", "field_declaration_list", "literal_value"},
            ("tree_sitter_go", "language"),
            dedent_exempt=re.compile(r"\w+:\s*($|//)"),
        ),
        _spec(
            "rust",
            Lexicon(("//",), ("/*", "*/"), ('"', "'"), frozenset({'"'}), char_quote=True),
            r"(pub|fn|struct|enum|impl|trait|mod|type|const|static|unsafe|async|extern|macro_rules!)\b|#\[",
            ("#[", "//", "/*", "*"),
            {"source_file", "block", "declaration_list", "field_declaration_list", "match_block"},
            ("tree_sitter_rust", "language"),
        ),
        _spec(
            "java",
            Lexicon(("//",), ("/*", "*/"), ('"""', '"', "'"), frozenset({'"""'}), char_quote=True),
            r"(public|private|protected|class|interface|enum|record|abstract|final)\b|@|" + _FUNCTION_HEADER,
            ("@", "//", "/*", "*"),
            {"program", "class_body", "interface_body", "block", "constructor_body", "switch_block"},
            ("tree_sitter_java", "language"),
        ),
        _spec(
            "c",
            _C_LEXICON,
            _C_DEFINITION,
            ("//", "/*", "*"),
            {"translation_unit", "compound_statement", "field_declaration_list"},
            ("tree_sitter_c", "language"),
            dedent_exempt=_LABEL_OR_DIRECTIVE,
        ),
        _spec(
            "cpp",
            _C_LEXICON,
            _C_DEFINITION + r"|(class|namespace|template|using)\b",
            ("//", "/*", "*"),
            {"translation_unit", "compound_statement", "field_declaration_list", "declaration_list"},
            ("tree_sitter_cpp", "language"),
            dedent_exempt=_LABEL_OR_DIRECTIVE,
        ),
    )
}

# Unknown languages: indentation and brackets only. Strings end at the line end so a stray quote cannot
# swallow the file; both comment styles are skipped.
FALLBACK = _spec(
    "text",
    Lexicon(("//", "#"), ("/*", "*/"), ('"', "'", "`"), frozenset()),
    r"(def|class|function|func|fn|sub|module|interface|struct|impl|export|public|private)\b|@",
    ("@", "#", "//", "/*", "*"),
    set(),
    None,
    indent_sensitive=True,
)

_LANGUAGE_IDS = {
    "python": "python",
    "py": "python",
    "python3": "python",
    "javascript": "javascript",
    "js": "javascript",
    "javascriptreact": "javascript",
    "jsx": "javascript",
    "typescript": "typescript",
    "ts": "typescript",
    "typescriptreact": "tsx",
    "tsx": "tsx",
    "go": "go",
    "golang": "go",
    "rust": "rust",
    "rs": "rust",
    "java": "java",
    "c": "c",
    "cpp": "cpp",
    "c++": "cpp",
    "cxx": "cpp",
    "cuda-cpp": "cpp",
}

_EXTENSIONS = {
    **dict.fromkeys(("py", "pyi", "pyw"), "python"),
    **dict.fromkeys(("js", "mjs", "cjs", "jsx"), "javascript"),
    **dict.fromkeys(("ts", "mts", "cts"), "typescript"),
    "tsx": "tsx",
    "go": "go",
    "rs": "rust",
    "java": "java",
    "c": "c",
    # .h goes to C++: its grammar is a superset that also reads C headers, the reverse is not true.
    **dict.fromkeys(
        ("cc", "cpp", "cxx", "c++", "h", "hh", "hpp", "hxx", "h++", "ipp", "tpp", "inl", "cu"), "cpp"
    ),
}


def detect_language(language_id: str | None = None, path: str | None = None) -> str | None:
    """Our name for the document's language, from the LSP languageId, else the extension; None if unknown.

    >>> detect_language("typescriptreact"), detect_language(None, "lib/x.rs"), detect_language("lua")
    ('tsx', 'rust', None)
    """
    if language_id and language_id.lower() in _LANGUAGE_IDS:
        return _LANGUAGE_IDS[language_id.lower()]
    if path:
        suffix = PurePath(path).suffix.lower().lstrip(".")
        return _EXTENSIONS.get(suffix)
    return None


def spec_for(language: str | None) -> LanguageSpec:
    """The spec of one of our language names; the indentation/bracket fallback for None or an unknown name."""
    return SPECS.get(language or "", FALLBACK)


@cache
def grammar_for(language: str) -> Language | None:
    """The tree-sitter language, or None when its wheel is not installed."""
    spec = SPECS.get(language)
    if spec is None or spec.grammar is None:
        return None
    module, function = spec.grammar
    try:
        return Language(getattr(importlib.import_module(module), function)())
    except (ImportError, AttributeError):
        return None


def new_parser(language: str | None) -> Parser | None:
    """A parser for the language (parsers are cheap; one per checker keeps them thread-confined)."""
    grammar = grammar_for(language) if language else None
    return Parser(grammar) if grammar is not None else None
