"""Cost of the syntax checker per check on a large generated file.

    .venv/bin/python -m eval.bench_syntax --lang python --lines 5000
    .venv/bin/python -m eval.bench_syntax --lang all

Builds a file of ~N lines of small functions, puts the cursor at the start of a function body in the middle,
and streams a completion (a function body, then the start of the next function) into the checker a few
characters at a time, as the engine would after each accepted chunk. Reports the constructor cost, the cost of
each `stop_at` + `visible` call (one "check"), `finalize`, and for scale one full reparse of the file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from completion_engine.syntax import SyntaxChecker
from completion_engine.syntax.languages import new_parser

# Per language: one function ({i} numbers it), then what the "model" writes at the cursor (the start of a
# body): a body, the function's end, and the start of another function.
TEMPLATES = {
    "python": (
        """\
def func_{i}(a, b):
    total = 0
    for x in range(a):
        if x % 2 == 0:
            total += x * b
        else:
            total -= {i}
    return total


""",
        """\
result = []
    for item in a:
        if item > b:
            result.append(item * 2)
    return sorted(result)


def extra(a):
    return a
""",
    ),
    "javascript": (
        """\
function func_{i}(a, b) {{
  let total = 0;
  for (let x = 0; x < a; x++) {{
    if (x % 2 === 0) {{
      total += x * b;
    }} else {{
      total -= {i};
    }}
  }}
  return total;
}}

""",
        """\
const result = [];
  for (const item of a) {
    if (item > b) {
      result.push(item * 2);
    }
  }
  return result.sort();
}

function extra(a) {
""",
    ),
    "typescript": (
        """\
function func_{i}(a: number, b: number): number {{
  let total = 0;
  for (let x = 0; x < a; x++) {{
    if (x % 2 === 0) {{
      total += x * b;
    }} else {{
      total -= {i};
    }}
  }}
  return total;
}}

""",
        """\
const result: number[] = [];
  for (const item of [a, b]) {
    if (item > b) {
      result.push(item * 2);
    }
  }
  return result.length;
}

function extra(a: number) {
""",
    ),
    "go": (
        """\
func func{i}(a int, b int) int {{
\ttotal := 0
\tfor x := 0; x < a; x++ {{
\t\tif x%2 == 0 {{
\t\t\ttotal += x * b
\t\t}} else {{
\t\t\ttotal -= {i}
\t\t}}
\t}}
\treturn total
}}

""",
        """\
result := 0
\tfor _, item := range []int{a, b} {
\t\tif item > b {
\t\t\tresult += item * 2
\t\t}
\t}
\treturn result
}

func extra(a int) int {
""",
    ),
    "rust": (
        """\
fn func_{i}(a: i64, b: i64) -> i64 {{
    let mut total = 0;
    for x in 0..a {{
        if x % 2 == 0 {{
            total += x * b;
        }} else {{
            total -= {i};
        }}
    }}
    total
}}

""",
        """\
let mut result = Vec::new();
    for item in [a, b] {
        if item > b {
            result.push(item * 2);
        }
    }
    result.len() as i64
}

fn extra(a: i64) {
""",
    ),
    "java": (
        """\
    static int func{i}(int a, int b) {{
        int total = 0;
        for (int x = 0; x < a; x++) {{
            if (x % 2 == 0) {{
                total += x * b;
            }} else {{
                total -= {i};
            }}
        }}
        return total;
    }}

""",
        """\
int result = 0;
        for (int item : new int[] {a, b}) {
            if (item > b) {
                result += item * 2;
            }
        }
        return result;
    }

    static int extra(int a) {
""",
    ),
    "c": (
        """\
int func_{i}(int a, int b) {{
    int total = 0;
    for (int x = 0; x < a; x++) {{
        if (x % 2 == 0) {{
            total += x * b;
        }} else {{
            total -= {i};
        }}
    }}
    return total;
}}

""",
        """\
int result = 0;
    int items[2] = {a, b};
    for (int k = 0; k < 2; k++) {
        if (items[k] > b) {
            result += items[k] * 2;
        }
    }
    return result;
}

int extra(int a) {
""",
    ),
}
TEMPLATES["cpp"] = TEMPLATES["c"]
WRAPPERS = {"java": ("class Big {\n", "}\n")}


@dataclass(frozen=True, slots=True)
class Result:
    language: str
    lines: int
    window_bytes: int  # what each check parses, instead of the whole file
    checks: int  # stop_at + visible calls until the checker said stop
    stop_reason: str
    construct_ms: float
    check_mean_ms: float  # CPU time of one check (stop_at + visible); the machine may be shared
    check_p50_ms: float
    check_p95_ms: float
    check_max_ms: float
    check_wall_mean_ms: float  # wall-clock time of one check
    finalize_ms: float
    full_reparse_ms: float  # for scale: one fresh parse of the whole file


def make_document(language: str, lines: int) -> tuple[str, str, str]:
    """(prefix, suffix, completion): a ~`lines`-line file with the cursor on a new line opened at the start of
    a function body in the middle of the file."""
    template, body = TEMPLATES[language]
    per_function = template.count("\n")
    head, tail = WRAPPERS.get(language, ("", ""))
    functions = [template.format(i=i) for i in range(max(lines // per_function, 2))]
    middle = len(functions) // 2
    target = functions[middle]
    cursor = target.index("\n") + 1
    indent = len(target[cursor:]) - len(target[cursor:].lstrip())
    prefix = head + "".join(functions[:middle]) + target[: cursor + indent]
    suffix = "\n" + target[cursor:] + "".join(functions[middle + 1 :]) + tail
    return prefix, suffix, body


def _timed(fn: Callable[[], object]) -> tuple[float, float, object]:
    """(CPU ms, wall ms, value)."""
    cpu, wall = time.process_time(), time.perf_counter()
    value = fn()
    return (time.process_time() - cpu) * 1e3, (time.perf_counter() - wall) * 1e3, value


def bench(language: str, lines: int, chunk: int, unknown: bool = False) -> Result:
    """`unknown`: give the checker no language, so it uses the indentation/bracket fallback."""
    prefix, suffix, completion = make_document(language, lines)
    checked_as = None if unknown else language
    construct_ms, _, checker = _timed(lambda: SyntaxChecker(prefix, suffix, checked_as))
    cpu_times, wall_times, reason = [], [], ""
    for end in range(chunk, len(completion) + chunk, chunk):
        text = completion[:end]
        cpu, wall, stop = _timed(lambda text=text: (checker.stop(text), checker.visible(text))[0])
        cpu_times.append(cpu)
        wall_times.append(wall)
        if stop is not None:
            reason = stop.reason
            break
    finalize_ms, _, _ = _timed(lambda: checker.finalize(completion))
    parser = new_parser(language)
    source = (prefix + completion + suffix).encode()
    full_ms = min(_timed(lambda: parser.parse(source))[0] for _ in range(3)) if parser else 0.0
    window = checker.window
    ordered = sorted(cpu_times)
    return Result(
        language=language + (" (as unknown)" if unknown else ""),
        lines=(prefix + suffix).count("\n"),
        window_bytes=len(window.prefix) + len(window.suffix) if window else 0,
        checks=len(cpu_times),
        stop_reason=reason,
        construct_ms=round(construct_ms, 2),
        check_mean_ms=round(statistics.fmean(cpu_times), 3),
        check_p50_ms=round(ordered[len(ordered) // 2], 3),
        check_p95_ms=round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))], 3),
        check_max_ms=round(ordered[-1], 3),
        check_wall_mean_ms=round(statistics.fmean(wall_times), 3),
        finalize_ms=round(finalize_ms, 2),
        full_reparse_ms=round(full_ms, 2),
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lang", default="python", help=f"one of {', '.join(TEMPLATES)}, or 'all'")
    parser.add_argument("--lines", type=int, default=5000)
    parser.add_argument(
        "--chunk", type=int, default=4, help="characters added between checks (about a token)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per language instead of a table")
    parser.add_argument("--unknown", action="store_true", help="check as an unknown language (no grammar)")
    args = parser.parse_args()
    languages = list(TEMPLATES) if args.lang == "all" else [args.lang]
    results = [bench(language, args.lines, args.chunk, args.unknown) for language in languages]
    if args.json:
        for result in results:
            print(json.dumps(asdict(result)))
        return
    columns = list(Result.__dataclass_fields__)
    widths = [max(len(c), 10) for c in columns]
    print("  ".join(f"{c:>{w}}" for c, w in zip(columns, widths, strict=True)))
    for result in results:
        row = asdict(result)
        print("  ".join(f"{row[c]!s:>{w}}" for c, w in zip(columns, widths, strict=True)))


if __name__ == "__main__":
    main()
