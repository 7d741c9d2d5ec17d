"""`spec-complete serve --ws --replicas N`: start or join Ray, deploy N engine replicas, build the front end.

Each replica is its own Ray Serve application of one replica ("spec-complete-0", "-1", ...), so the
front end holds one handle per replica and routes by session itself (serving/routing.py). Ray Serve
health-checks each replica and replaces one whose process dies; the front end notices the failure
on the request path and moves that replica's sessions until the replacement answers.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
from dataclasses import dataclass

from lsp_server.session import SharedState
from lsp_server.settings import ServerLimits

logger = logging.getLogger(__name__)

APP_PREFIX = "spec-complete-"


@dataclass(slots=True)
class RoutedState(SharedState):
    """SharedState whose worker is a RemoteWorker: stats add the per-replica view."""

    def stats(self, client) -> dict:
        """The single-process stats for `client` (its own documents and requests), plus the replicas'."""
        snapshot = SharedState.stats(self, client)
        worker = self.worker
        replicas = worker.replica_stats()
        snapshot.update(
            corpus_tokens=sum((entry["corpus_tokens"] or 0) for entry in _remote(worker)),
            warmups=sum((entry["warmups"] or 0) for entry in replicas),
            retried=worker.retried,
            replicas=replicas,
        )
        return snapshot

    def metrics_text(self) -> bytes:
        return self.worker.metrics.render()


def _remote(worker) -> list[dict]:
    return [{"corpus_tokens": stats.get("corpus_tokens")} for stats in worker.remote_stats.values()]


def start_routed(args: argparse.Namespace) -> RoutedState:
    """Start Ray (or connect to --ray-address), deploy the replicas and wait until each has loaded."""
    import ray
    from ray import serve

    from completion_engine.options import engine_config
    from lsp_server.stats import ServerCounters
    from serving.front import DocumentMirror, RemoteWorker
    from serving.replica import EngineReplica, ReplicaConfig

    if args.ray_address:
        ray.init(address=args.ray_address, logging_level=logging.WARNING, log_to_driver=args.verbose)
    else:
        ray.init(
            num_cpus=args.ray_cpus or os.cpu_count(),
            num_gpus=None,
            include_dashboard=False,
            logging_level=logging.WARNING,
            log_to_driver=args.verbose,
            object_store_memory=128 * 1024 * 1024,
        )
    if not args.verbose:
        logging.getLogger("ray.serve").setLevel(logging.WARNING)
    signal.signal(signal.SIGTERM, _interrupt)  # after ray.init, which sets its own: replicas go down too
    serve.start(proxy_location="Disabled", logging_config={"log_level": "WARNING"})
    limits = ServerLimits(
        queue_size=args.queue_size,
        max_document_bytes=args.max_document_kb * 1024,
        corpus_tokens=args.corpus_tokens,
        max_clients=args.max_clients,
    )
    config = ReplicaConfig(engine_config(args), args.queue_size, args.corpus_tokens)
    actor_options = {"num_cpus": args.cpus_per_replica, "num_gpus": args.gpus_per_replica}
    env = {name: value for name, value in os.environ.items() if name.startswith("SPEC_COMPLETE_")}
    if env:
        actor_options["runtime_env"] = {"env_vars": env}
    replica_logging = {"log_level": "INFO" if args.verbose else "WARNING", "enable_access_log": args.verbose}
    names = [f"{APP_PREFIX}{index}" for index in range(args.replicas)]
    handles = {}
    try:
        for name in names:
            deployment = EngineReplica.options(
                name=name,
                num_replicas=1,
                ray_actor_options=actor_options,
                logging_config=replica_logging,
            )
            handles[name] = serve.run(deployment.bind(config), name=name, route_prefix=None)
    except BaseException:
        _shutdown(args.ray_address is not None, names)
        raise

    def stop() -> None:
        _shutdown(args.ray_address is not None, names)

    counters = ServerCounters()
    mirror = DocumentMirror()
    worker = RemoteWorker(handles, mirror, counters, args.queue_size, args.overload_at, on_stop=stop)
    from completion_engine.options import completion_options

    defaults = completion_options(args)
    model = {
        "target": args.target,
        "draft_model": args.draft_model,
        "replicas": args.replicas,
        "gpus_per_replica": args.gpus_per_replica,
        "ray_address": args.ray_address,
    }
    return RoutedState(
        worker=worker,
        corpus=mirror,
        counters=counters,
        limits=limits,
        defaults=defaults,
        model=model,
        draft_model_loaded=args.draft_model is not None,
    )


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _shutdown(joined_cluster: bool, names: list[str]) -> None:
    """Take the replicas down; a local Ray instance started here goes with them."""
    import ray
    from ray import serve

    if not ray.is_initialized():
        return
    try:
        if joined_cluster:
            for name in names:
                serve.delete(name)
        else:
            serve.shutdown()
    finally:
        ray.shutdown()
