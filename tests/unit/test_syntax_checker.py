"""SyntaxChecker on real snippets, one set per language: the cursor is `<|>`.

Each language has four cases from the issue: a completion that closes the function (and runs on into the
next one), one that would leave an unbalanced bracket, one that repeats the code after the cursor, and the
first case again in a file that already contains an error elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from completion_engine.syntax import SyntaxChecker
from completion_engine.syntax.languages import new_parser
from completion_engine.syntax.window import count_errors


def split(document: str) -> tuple[str, str]:
    prefix, suffix = document.split("<|>")
    return prefix, suffix


def file_errors(language: str, text: str) -> int:
    """ERROR + MISSING nodes of a fresh parse of the whole text."""
    return count_errors(new_parser(language).parse(text.encode()).root_node)


def stream(checker: SyntaxChecker, completion: str, chunk: int = 3) -> tuple[str, int]:
    """Feed the completion a few characters at a time, as the engine does: (kept text, chars generated)."""
    for end in range(chunk, len(completion) + chunk, chunk):
        text = completion[:end]
        n = checker.stop_at(text)
        if n is not None:
            return text[:n], len(text)
    return completion, len(completion)


@dataclass(frozen=True)
class Snippet:
    language: str
    document: str  # with <|> at the cursor
    closes: str  # completion: the body, the function's end, and the start of the next definition
    closes_kept: str  # what a stop keeps of it
    unbalanced: str  # completion with a bracket it never closes (or closes wrongly)
    repeats: str  # completion that reproduces the code after the cursor
    repeats_kept: str
    broken: str  # replace document's first occurrence of broken[0] by broken[1]: an error elsewhere


SNIPPETS = [
    Snippet(
        "python",
        "import os\n\n\nclass Store:\n    def __init__(self, root):\n        self.root = root\n\n"
        "    def path(self, name):\n        <|>\n\n    def exists(self, name):\n"
        "        return os.path.exists(self.path(name))\n",
        closes="full = os.path.join(self.root, name)\n        return full\n\n    def size(self, name):\n"
        "        return 0\n",
        closes_kept="full = os.path.join(self.root, name)\n        return full",
        unbalanced="return os.path.join(self.root, name\n",
        repeats="return os.path.join(self.root, name)\n\n    def exists(self, name):\n"
        "        return os.path.exists(self.path(name))\n",
        repeats_kept="return os.path.join(self.root, name)",
        broken=("def exists(self, name):", "def exists(self, name:"),
    ),
    Snippet(
        "javascript",
        'const express = require("express");\n\nfunction handler(req, res) {\n  const id = req.params.id;\n'
        "  <|>\n}\n\nmodule.exports = handler;\n",
        closes='if (!id) {\n    return res.status(400).send("missing id");\n  }\n  res.json({ id });\n}\n\n'
        "function other() {\n",
        closes_kept='if (!id) {\n    return res.status(400).send("missing id");\n  }\n  res.json({ id });',
        unbalanced="res.json({ id: id, tags: [1, 2 });\n}\n",
        repeats="res.json({ id });\n}\n\nmodule.exports = handler;\n",
        repeats_kept="res.json({ id });",
        broken=('require("express");', 'require("express";'),
    ),
    Snippet(
        "typescript",
        "interface User {\n  id: number;\n  name: string;\n}\n\nexport function label(user: User): string {\n"
        '  <|>\n}\n\nexport const DEFAULT: User = { id: 0, name: "" };\n',
        closes='const prefix = user.id > 0 ? `#${user.id}` : "new";\n'
        "  return `${prefix} ${user.name}`;\n}\n\n"
        "export function other(): void {\n",
        closes_kept='const prefix = user.id > 0 ? `#${user.id}` : "new";\n  return `${prefix} ${user.name}`;',
        unbalanced='return [user.id, user.name.join(", ");\n}\n',
        repeats='return user.name;\n}\n\nexport const DEFAULT: User = { id: 0, name: "" };\n',
        repeats_kept="return user.name;",
        broken=("name: string;", "name: string = ;"),
    ),
    Snippet(
        "go",
        'package main\n\nimport "fmt"\n\nfunc greet(name string) string {\n\t<|>\n}\n\nfunc main() {\n'
        '\tfmt.Println(greet("gopher"))\n}\n',
        closes='if name == "" {\n\t\tname = "world"\n\t}\n\treturn fmt.Sprintf("hello %s", name)\n}\n\n'
        "func other() {\n",
        closes_kept='if name == "" {\n\t\tname = "world"\n\t}\n\treturn fmt.Sprintf("hello %s", name)',
        unbalanced='return fmt.Sprintf("hello %s", (name)\n}\n',
        repeats='return "hello " + name\n}\n\nfunc main() {\n\tfmt.Println(greet("gopher"))\n}\n',
        repeats_kept='return "hello " + name',
        broken=('fmt.Println(greet("gopher"))', 'fmt.Println(greet("gopher")'),
    ),
    Snippet(
        "rust",
        "struct Counter {\n    n: u32,\n}\n\nimpl Counter {\n    fn bump(&mut self) -> u32 {\n"
        "        <|>\n    }\n\n"
        "    fn get(&self) -> u32 {\n        self.n\n    }\n}\n",
        closes="self.n += 1;\n        self.n\n    }\n\n    fn reset(&mut self) {\n        self.n = 0;\n",
        closes_kept="self.n += 1;\n        self.n",
        unbalanced="let step: Vec<u32> = vec![1, 2;\n        self.n\n    }\n",
        repeats="self.n + 1\n    }\n\n    fn get(&self) -> u32 {\n        self.n\n    }\n}\n",
        repeats_kept="self.n + 1",
        broken=("n: u32,", "n: ,"),
    ),
    Snippet(
        "java",
        "public class Greeter {\n    private final String name;\n\n    public Greeter(String name) {\n"
        "        this.name = name;\n    }\n\n    public String greet() {\n        <|>\n    }\n}\n",
        closes='if (name.isEmpty()) {\n            return "Hello!";\n        }\n'
        '        return "Hello, " + name;\n'
        "    }\n\n    public static void main(String[] args) {\n",
        closes_kept='if (name.isEmpty()) {\n            return "Hello!";\n        }\n'
        '        return "Hello, " + name;',
        unbalanced='return String.format("Hello, %s", name.trim();\n    }\n',
        repeats='return "Hello, " + name;\n    }\n}\n',
        repeats_kept='return "Hello, " + name;',
        broken=("this.name = name;", "this.name = name"),
    ),
    Snippet(
        "c",
        "#include <stdio.h>\n\nint sum(const int *xs, int n) {\n    <|>\n}\n\nint main(void) {\n"
        '    int xs[3] = {1, 2, 3};\n    printf("%d\\n", sum(xs, 3));\n    return 0;\n}\n',
        closes="int total = 0;\n    for (int i = 0; i < n; i++) {\n        total += xs[i];\n    }\n"
        "    return total;\n}\n\nint product(const int *xs, int n) {\n",
        closes_kept="int total = 0;\n    for (int i = 0; i < n; i++) {\n        total += xs[i];\n    }\n"
        "    return total;",
        unbalanced="int total = 0;\n    for (int i = 0; i < n; i++ {\n        total += xs[i];\n    }\n"
        "    return total;\n}\n",
        repeats="return n > 0 ? xs[0] : 0;\n}\n\nint main(void) {\n    int xs[3] = {1, 2, 3};\n",
        repeats_kept="return n > 0 ? xs[0] : 0;",
        broken=("int xs[3] = {1, 2, 3};", "int xs[3] = {1, 2, 3;"),
    ),
    Snippet(
        "cpp",
        "#include <vector>\n\nclass Stack {\npublic:\n    void push(int x) {\n        <|>\n    }\n\n"
        "    bool empty() const { return items_.empty(); }\n\nprivate:\n    std::vector<int> items_;\n};\n",
        closes="items_.push_back(x);\n    }\n\n    int pop() {\n        int x = items_.back();\n",
        closes_kept="items_.push_back(x);",
        unbalanced="if (x > 0 {\n            items_.push_back(x);\n        }\n    }\n",
        repeats="items_.push_back(x);\n    }\n\n    bool empty() const { return items_.empty(); }\n",
        repeats_kept="items_.push_back(x);",
        broken=("std::vector<int> items_;", "std::vector<int items_;"),
    ),
]
IDS = [s.language for s in SNIPPETS]


@pytest.mark.parametrize("snippet", SNIPPETS, ids=IDS)
def test_completion_that_closes_the_function_stops_there(snippet: Snippet) -> None:
    checker = SyntaxChecker(*split(snippet.document), snippet.language)
    kept, generated = stream(checker, snippet.closes)
    assert kept == snippet.closes_kept
    assert generated < len(snippet.closes)  # the stop came before the model finished: forward passes saved
    assert checker.finalize(snippet.closes) == snippet.closes_kept


@pytest.mark.parametrize("snippet", SNIPPETS, ids=IDS)
def test_unbalanced_bracket_is_truncated_to_a_clean_prefix(snippet: Snippet) -> None:
    prefix, suffix = split(snippet.document)
    final = SyntaxChecker(prefix, suffix, snippet.language).finalize(snippet.unbalanced)
    assert snippet.unbalanced.startswith(final)
    assert file_errors(snippet.language, prefix + final + suffix) <= file_errors(
        snippet.language, prefix + suffix
    )
    assert file_errors(snippet.language, prefix + snippet.unbalanced + suffix) > 0


@pytest.mark.parametrize("snippet", SNIPPETS, ids=IDS)
def test_repetition_of_the_suffix_is_dropped(snippet: Snippet) -> None:
    checker = SyntaxChecker(*split(snippet.document), snippet.language)
    kept, generated = stream(checker, snippet.repeats)
    assert kept == snippet.repeats_kept
    assert generated < len(snippet.repeats)
    assert checker.finalize(snippet.repeats) == snippet.repeats_kept


@pytest.mark.parametrize("snippet", SNIPPETS, ids=IDS)
def test_file_with_an_error_elsewhere_is_judged_against_its_own_baseline(snippet: Snippet) -> None:
    broken = snippet.document.replace(*snippet.broken, 1)
    assert broken != snippet.document
    prefix, suffix = split(broken)
    assert file_errors(snippet.language, prefix + suffix) > 0
    checker = SyntaxChecker(prefix, suffix, snippet.language)
    kept, _ = stream(checker, snippet.closes)
    assert kept == snippet.closes_kept
    final = checker.finalize(snippet.closes)
    assert final == snippet.closes_kept
    assert file_errors(snippet.language, prefix + final + suffix) <= file_errors(
        snippet.language, prefix + suffix
    )


@pytest.mark.parametrize("snippet", SNIPPETS, ids=IDS)
def test_visible_text_only_grows_and_ends_at_the_final_text(snippet: Snippet) -> None:
    checker = SyntaxChecker(*split(snippet.document), snippet.language)
    shown = ""
    for end in range(3, len(snippet.closes) + 3, 3):
        text = snippet.closes[:end]
        now = checker.visible(text)
        assert now.startswith(shown)
        shown = now
        if checker.stop_at(text) is not None:
            break
    assert shown == snippet.closes_kept


# (language, document with <|>, completion, what finalize keeps): cursor positions beyond "start of a body".
SCENARIOS = [
    # mid-line: the rest of the line is not repeated, and the line ends the completion
    ("python", "x = foo(<|>)\nprint(x)\n", "a, b)\nprint(x)\n", "a, b"),
    ("python", "x = foo(<|>)\n", "g(a))\n", "g(a)"),
    (
        "python",
        "def f(x):\n    return x.<|>\n\n\ndef g():\n    pass\n",
        "strip().lower()\n\n\ndef h():\n",
        "strip().lower()",
    ),
    ("c", "int f(int x) {\n    return g(<|>);\n}\n", "x, 1);\n}\n", "x, 1"),
    ("typescript", "function f(u: U): string {\n  return <|>;\n}\n", "`${u.id}`;\n}\n", "`${u.id}`"),
    # inside a docstring, a comment, a JSX element
    (
        "python",
        'def f(x):\n    """<|>"""\n    return x\n',
        'Return x unchanged."""\n    return x\n',
        "Return x unchanged.",
    ),
    ("python", "def f(x):\n    # <|>\n    return x\n", "the identity\n    return x\n", "the identity"),
    ("tsx", "function App() {\n  return <div><|></div>;\n}\n", "<b>hi</b></div>;\n}\n", "<b>hi</b>"),
    # code after the cursor on its line stays on a line of its own
    ("python", "def f(x):\n    y = x\n    <|>return y\n", "z = y + 1\n    return y\n", "z = y + 1\n    "),
    # at the end of the file the model's closing brace is kept; with the brace in the suffix it is dropped
    ("javascript", "function f(x) {\n  <|>", "return x + 1;\n}\n\nfunction g() {}\n", "return x + 1;\n}"),
    ("javascript", "function f(x) {\n  <|>\n}\n", "return x + 1;\n}\n\nfunction g() {}\n", "return x + 1;"),
    # top level: one definition (with its decorator), not the next one
    (
        "python",
        "import os\n\n<|>",
        "@cache\ndef a():\n    return 1\n\n\n@cache\ndef b():\n",
        "@cache\ndef a():\n    return 1\n",
    ),
    (
        "go",
        "package main\n\n<|>",
        "func a() int {\n\treturn 1\n}\n\nfunc b() {\n",
        "func a() int {\n\treturn 1\n}\n",
    ),
    # a multi-line list: the closing bracket belongs to the suffix
    ("python", "xs = [\n    1,\n    <|>\n]\n", "2,\n    3,\n]\nprint(xs)\n", "2,\n    3,"),
    (
        "rust",
        "fn f(v: &[i32]) -> i32 {\n    match v.len() {\n        0 => 0,\n        <|>\n    }\n}\n",
        "_ => v[0],\n    }\n}\n",
        "_ => v[0],",
    ),
    # unknown languages: indentation and brackets
    (None, "local function f(x)\n  <|>\nend\n", "return x + 1\nend\n\nlocal function g()\n", "return x + 1"),
    (None, "fun f(x: Int): Int {\n    <|>\n}\n", "return x + 1\n}\n\nfun g() {}\n", "return x + 1"),
]


@pytest.mark.parametrize(("language", "document", "completion", "expected"), SCENARIOS)
def test_scenarios(language: str | None, document: str, completion: str, expected: str) -> None:
    prefix, suffix = split(document)
    checker = SyntaxChecker(prefix, suffix, language)
    assert checker.finalize(completion) == expected
    kept, _ = stream(checker, completion, chunk=2)
    assert kept == expected
