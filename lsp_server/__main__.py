"""`python -m lsp_server [--stdio | --ws ...]`: the same as `spec-complete serve`."""

from __future__ import annotations

import argparse
import sys

from lsp_server.cli import add_serve_arguments, run_serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lsp_server", description="spec-complete language server")
    add_serve_arguments(parser)
    return run_serve(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
