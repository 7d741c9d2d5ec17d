"""`spec-complete serve`: the flags, the checks made before any model loads, and the start."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
import sys
from urllib.parse import urlsplit

from completion_engine.drafters import DRAFT_METHODS, draft_problem
from completion_engine.fim import FIM_CHOICES
from completion_engine.options import (
    add_engine_arguments,
    apply_threads_argument,
    completion_options,
    eagle_tree_problem,
    engine_config,
    resolve_draft_defaults,
)
from lsp_server.settings import MAX_NEW_TOKENS_CAP, ServerLimits

DEFAULT_PORT = 8765
TOKEN_ENV = "SPEC_COMPLETE_TOKEN"


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    transport = parser.add_argument_group("transport")
    which = transport.add_mutually_exclusive_group()
    which.add_argument(
        "--stdio", action="store_true", help="serve one client over stdin/stdout (the default)"
    )
    which.add_argument(
        "--ws", action="store_true", help="serve WebSocket clients (one JSON-RPC message per text message)"
    )
    transport.add_argument(
        "--host", default="127.0.0.1", help="address to bind with --ws (default: 127.0.0.1)"
    )
    transport.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"port for --ws; 0 picks a free one (default: {DEFAULT_PORT})",
    )
    transport.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow --host to be a non-loopback address (needs --token)",
    )
    transport.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV) or None,
        help=f"secret clients must present (?token=T or Authorization: Bearer T); default: ${TOKEN_ENV}, "
        "else a new one each run, printed with the URL",
    )
    transport.add_argument(
        "--no-token",
        action="store_true",
        help="with --ws on loopback, let clients in without a token (any local program may then connect)",
    )
    transport.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let browser pages from ORIGIN (e.g. https://ide.example.com) connect; repeatable. Without it "
        "handshakes that carry an Origin header other than VS Code's are refused",
    )

    add_engine_arguments(parser.add_argument_group("model"))

    completion = parser.add_argument_group(
        "completions (a client's initializationOptions may override these)"
    )
    completion.add_argument(
        "--draft",
        choices=DRAFT_METHODS,
        default=None,
        help="draft method (default: hybrid when a draft model is loaded, else ngram)",
    )
    completion.add_argument(
        "--max-new-tokens", type=int, default=64, help="tokens per completion (default: 64)"
    )
    completion.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default: 0)")
    completion.add_argument(
        "--no-syntax", action="store_true", help="do not stop or trim completions by syntax"
    )
    completion.add_argument("--fim", default="auto", choices=FIM_CHOICES, help="fill-in-the-middle format")
    completion.add_argument(
        "--cross-file-tokens", type=int, default=0, help="budget for snippets of other open documents"
    )
    completion.add_argument(
        "--no-healing", action="store_true", help="no token healing of the prompt's last token"
    )

    limits = parser.add_argument_group("limits")
    defaults = ServerLimits()
    limits.add_argument(
        "--queue-size", type=int, default=defaults.queue_size, help="requests waiting, all clients"
    )
    limits.add_argument(
        "--max-document-kb",
        type=int,
        default=defaults.max_document_bytes // 1024,
        help="larger documents are refused",
    )
    limits.add_argument(
        "--max-documents", type=int, default=defaults.max_documents, help="open documents per client"
    )
    limits.add_argument(
        "--max-changes", type=int, default=defaults.max_changes, help="content changes in one didChange"
    )
    limits.add_argument(
        "--corpus-tokens", type=int, default=defaults.corpus_tokens, help="n-gram corpus token cap"
    )
    limits.add_argument(
        "--max-clients", type=int, default=defaults.max_clients, help="WebSocket connections at once"
    )
    add_replica_arguments(parser.add_argument_group("replicas (Ray Serve; needs the serve extra)"))
    parser.add_argument("-v", "--verbose", action="store_true", help="log each request to stderr")


def add_replica_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--replicas",
        type=int,
        default=0,
        help="run N engine replicas on Ray Serve behind this front end (with --ws; default: one "
        "in-process model worker, no Ray); with --max-replicas, how many to start with",
    )
    group.add_argument(
        "--min-replicas",
        type=int,
        default=None,
        help="autoscale: never fewer replicas than this (at least 1; default 1; needs --max-replicas)",
    )
    group.add_argument(
        "--max-replicas",
        type=int,
        default=None,
        help="autoscale the replicas with Ray Serve, never more than this",
    )
    group.add_argument(
        "--target-ongoing-requests",
        type=float,
        default=None,
        help="autoscale: requests outstanding per replica that Ray Serve aims at (default 2)",
    )
    group.add_argument(
        "--upscale-delay-s",
        type=float,
        default=None,
        help="autoscale: how long the load must call for more replicas before one starts (default 30)",
    )
    group.add_argument(
        "--downscale-delay-s",
        type=float,
        default=None,
        help="autoscale: how long the load must allow fewer replicas before one stops (default 600)",
    )
    group.add_argument(
        "--ray-address", default=None, help="join this Ray cluster (default: start a local Ray instance)"
    )
    group.add_argument("--gpus-per-replica", type=float, default=0.0, help="GPUs each replica holds")
    group.add_argument("--cpus-per-replica", type=float, default=1.0, help="CPUs each replica holds")
    group.add_argument(
        "--ray-cpus", type=int, default=None, help="CPUs of the local Ray instance (default: all cores)"
    )
    group.add_argument(
        "--overload-at",
        type=int,
        default=4,
        help="outstanding requests at which a replica's sessions move elsewhere (default: 4)",
    )


def check_serve_arguments(args: argparse.Namespace) -> str | None:
    """Why these arguments cannot start a server, or None. Runs before any model is loaded."""
    from lsp_server.transport import is_loopback

    for origin in args.allow_origin:
        if "://" not in origin or urlsplit(origin).path not in ("", "/"):
            return f"--allow-origin takes an origin such as https://ide.example.com, not {origin!r}"
    if args.no_token and args.token is not None:
        return f"--no-token and a token (--token or ${TOKEN_ENV}) contradict each other: choose one"
    if args.no_token and not is_loopback(args.host):
        return "--no-token is for loopback only: a server reachable from other machines needs a token"
    if args.ws and not is_loopback(args.host):
        if not args.allow_remote:
            return (
                f"refusing to bind {args.host}: it is not a loopback address. Pass --allow-remote and "
                f"a --token (or ${TOKEN_ENV}) that clients present, or bind 127.0.0.1 and tunnel (ssh -L)"
            )
        if not args.token:
            return f"refusing to bind {args.host} without a token: pass --token T (or set ${TOKEN_ENV})"
    if args.token is not None and len(args.token) < 8:
        return "the token is too short: use at least 8 characters (e.g. `openssl rand -hex 16`)"
    if not 0 <= args.port <= 65535:
        return f"--port must be 0..65535, not {args.port}"
    problem = replica_problem(args)
    if problem:
        return problem
    resolve_draft_defaults(args)
    problem = draft_problem(args.draft, args.draft_model is not None) or eagle_tree_problem(args)
    if problem:
        return problem
    if not 1 <= args.max_new_tokens <= MAX_NEW_TOKENS_CAP:
        return f"--max-new-tokens must be 1..{MAX_NEW_TOKENS_CAP}"
    for name in (
        "queue_size",
        "max_document_kb",
        "max_documents",
        "max_changes",
        "corpus_tokens",
        "max_clients",
        "max_context",
        "threads",
    ):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be at least 1"
    return None


AUTOSCALING_DEFAULTS = {"target_ongoing_requests": 2.0, "upscale_delay_s": 30.0, "downscale_delay_s": 600.0}


def routed(args: argparse.Namespace) -> bool:
    """Whether `serve` runs engine replicas on Ray Serve (else one in-process worker, no Ray)."""
    return bool(getattr(args, "replicas", 0) or getattr(args, "max_replicas", None))


def replica_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the replica flags, or None; fills in the autoscaling defaults."""
    autoscaling = ["min_replicas", *AUTOSCALING_DEFAULTS]
    if not hasattr(args, "replicas"):
        return None
    if args.max_replicas is None:
        given = [name for name in autoscaling if getattr(args, name) is not None]
        if given:
            return f"--{given[0].replace('_', '-')} is an autoscaling bound: it needs --max-replicas"
    if not routed(args):
        return None
    if not args.ws:
        return "--replicas needs --ws (the replicas serve many editors over WebSocket)"
    if args.replicas < 0 or args.overload_at < 1:
        return "--replicas must be at least 1 and --overload-at at least 1"
    most = args.replicas
    if args.max_replicas is not None:
        if args.min_replicas is None:
            args.min_replicas = 1
        for name, default in AUTOSCALING_DEFAULTS.items():
            if getattr(args, name) is None:
                setattr(args, name, default)
        if args.min_replicas < 1:  # the front end only sends to running replicas: none would wake one
            return "--min-replicas must be at least 1 (the replicas cannot scale to zero)"
        if args.max_replicas < args.min_replicas:
            return f"--max-replicas ({args.max_replicas}) is below --min-replicas ({args.min_replicas})"
        if args.replicas and not args.min_replicas <= args.replicas <= args.max_replicas:
            return (
                f"--replicas {args.replicas} (the replicas to start with) is outside "
                f"--min-replicas {args.min_replicas} .. --max-replicas {args.max_replicas}"
            )
        if args.target_ongoing_requests <= 0 or args.upscale_delay_s < 0 or args.downscale_delay_s < 0:
            return "--target-ongoing-requests must be above 0 and the scale delays at least 0"
        most = args.max_replicas
    cpus = args.ray_cpus or os.cpu_count() or 1
    if not args.ray_address and most * args.cpus_per_replica > cpus:
        return (
            f"{most} replicas x {args.cpus_per_replica:g} CPUs do not fit the {cpus} CPUs "
            f"of the local Ray instance: pass --cpus-per-replica {cpus / most:g} (or --ray-cpus)"
        )
    return None


def run_serve(args: argparse.Namespace) -> int:
    problem = check_serve_arguments(args)
    if problem:
        print(f"spec-complete serve: {problem}", file=sys.stderr)
        return 2
    _configure_logging(args.verbose)
    apply_threads_argument(args)  # read when torch loads, which happens below
    stdout = sys.stdout.buffer
    if not args.ws:
        sys.stdout = sys.stderr  # stdout carries the protocol: stray prints must not land there
    try:
        shared = _start_routed(args) if routed(args) else _start_shared(args)
    except Exception as error:  # ModelLoadError and friends carry a message that says what to do
        print(f"spec-complete serve: could not load the model: {error}", file=sys.stderr)
        return 1
    try:
        if args.ws:
            return _run_ws(shared, args)
        return asyncio.run(_stdio(shared, stdout))
    except KeyboardInterrupt:
        return 0
    finally:
        shared.worker.stop()


async def _stdio(shared, stdout) -> int:
    from lsp_server.transport import FdReader, serve_stdio

    return await serve_stdio(shared, FdReader(sys.stdin.fileno()), stdout)


def ws_token(args: argparse.Namespace) -> tuple[str | None, bool]:
    """The token WebSocket clients must present, and whether it was generated for this run."""
    if args.no_token:
        return None, False
    if args.token:
        return args.token, False
    return secrets.token_urlsafe(18), True


def _run_ws(shared, args: argparse.Namespace) -> int:
    from lsp_server.transport import WsOptions, print_line, serve_ws

    token, generated = ws_token(args)

    def announce(url: str) -> None:
        # A token given by the user stays off the terminal; a generated one is there to be pasted.
        shown = f"{url}/?token={token}" if generated else f"{url}/?token=…" if token else url
        print_line(f"spec-complete: listening on {shown} (model {args.target}, draft {args.draft})")
        print_line(
            "spec-complete: in VS Code set specComplete.connection to websocket and specComplete.url to "
            f"{shown}{' (the token: specComplete.token)' if token and not generated else ''}; editors "
            "without WebSocket support (Neovim, Helix) run `spec-complete serve --stdio` as their "
            "language server command instead"
        )

    options = WsOptions(host=args.host, port=args.port, token=token, allowed_origins=tuple(args.allow_origin))
    try:
        asyncio.run(serve_ws(shared, options, announce))
    except OSError as error:
        print(f"spec-complete serve: cannot listen on {args.host}:{args.port}: {error}", file=sys.stderr)
        return 1
    return 0


def _start_routed(args: argparse.Namespace):
    """The replicas on Ray Serve and the front end that routes to them (imports Ray, never torch)."""
    from serving.launch import start_routed

    return start_routed(args)


def _start_shared(args: argparse.Namespace):
    """Load the engine and start the model worker (the slow part: imports torch, loads weights)."""
    from completion_engine.engine import CompletionEngine
    from lsp_server.corpus import CorpusFeed
    from lsp_server.session import SharedState
    from lsp_server.stats import ServerCounters
    from lsp_server.worker import ModelWorker

    config = engine_config(args)
    counters = ServerCounters()
    corpus = CorpusFeed(args.corpus_tokens)
    # built on the worker's thread, which makes every torch call (ModelWorker says why)
    worker = ModelWorker.loading(
        lambda: CompletionEngine.from_config(config), corpus, counters, args.queue_size
    )
    engine = worker.engine
    model = {
        "target": args.target,
        "draft_model": args.draft_model,
        "device": str(engine.target_runner.device),
        "threads": engine.threads,
    }
    return shared_state(SharedState, args, worker, corpus, counters, model)


def shared_state(state_class, args: argparse.Namespace, worker, corpus, counters, model: dict):
    """What every connection shares, from the flags: one worker (local, or the replicas) and its corpus."""
    limits = ServerLimits(
        queue_size=args.queue_size,
        max_document_bytes=args.max_document_kb * 1024,
        max_documents=args.max_documents,
        max_changes=args.max_changes,
        corpus_tokens=args.corpus_tokens,
        max_clients=args.max_clients,
    )
    return state_class(
        worker=worker,
        corpus=corpus,
        counters=counters,
        limits=limits,
        defaults=completion_options(args),
        model=model,
        draft_model_loaded=args.draft_model is not None,
    )


def _configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO if verbose else logging.WARNING,
        format="spec-complete: %(message)s",
    )
    logging.getLogger("pygls").setLevel(logging.WARNING if verbose else logging.CRITICAL)
    logging.getLogger("websockets").setLevel(logging.WARNING if verbose else logging.ERROR)
