"""`serve --ws --replicas N` or `--min-replicas A --max-replicas B`: Ray, the replicas, the front end.

The replicas are one Ray Serve deployment ("spec-complete"): a fixed number (--replicas), or as many
as Ray Serve's autoscaler keeps between the bounds (--min-replicas/--max-replicas, scaling on the
requests outstanding per replica). Its request router (serving/affinity.py) carries out the front
end's per-session placement and reports which replicas run. Ray Serve health-checks each replica and
replaces one whose process dies; the front end notices a failure on the request path and moves that
replica's sessions.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from dataclasses import dataclass

from lsp_server.cli import shared_state
from lsp_server.session import SharedState

logger = logging.getLogger(__name__)

APP_NAME = "spec-complete"
FIRST_PING_TIMEOUT_S = 300.0
SHUTDOWN_TIMEOUT_S = 20.0  # for Serve's graceful stop, before Ray goes down regardless


def scaling_options(args: argparse.Namespace) -> dict:
    """The deployment's replica count: fixed, or Ray Serve's autoscaling config within the bounds.

    >>> scaling_options(argparse.Namespace(replicas=2, max_replicas=None))
    {'num_replicas': 2}
    >>> bounds = argparse.Namespace(replicas=0, min_replicas=1, max_replicas=3,
    ...     target_ongoing_requests=2.0, upscale_delay_s=30.0, downscale_delay_s=600.0)
    >>> scaling_options(bounds)["autoscaling_config"]["initial_replicas"] is None  # min_replicas to start
    True
    """
    if args.max_replicas is None:
        return {"num_replicas": args.replicas}
    return {
        "autoscaling_config": {
            "min_replicas": args.min_replicas,
            "max_replicas": args.max_replicas,
            "initial_replicas": args.replicas or None,  # None: start with min_replicas
            "target_ongoing_requests": args.target_ongoing_requests,
            "upscale_delay_s": args.upscale_delay_s,
            "downscale_delay_s": args.downscale_delay_s,
        }
    }


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
    """Start Ray (or connect to --ray-address), deploy the replicas and wait until they have loaded."""
    import ray
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from completion_engine.options import engine_config
    from lsp_server.stats import ServerCounters
    from serving.affinity import SessionAffinityRouter
    from serving.front import DocumentMirror, RemoteWorker
    from serving.membership import listen
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
    config = ReplicaConfig(engine_config(args), args.queue_size, args.corpus_tokens)
    actor_options = {"num_cpus": args.cpus_per_replica, "num_gpus": args.gpus_per_replica}
    env = {name: value for name, value in os.environ.items() if name.startswith("SPEC_COMPLETE_")}
    if env:
        actor_options["runtime_env"] = {"env_vars": env}
    counters = ServerCounters()
    mirror = DocumentMirror()
    joined = args.ray_address is not None
    try:
        deployment = EngineReplica.options(
            name=APP_NAME,
            ray_actor_options=actor_options,
            logging_config={
                "log_level": "INFO" if args.verbose else "WARNING",
                "enable_access_log": args.verbose,
            },
            request_router_config=RequestRouterConfig(request_router_class=SessionAffinityRouter),
            **scaling_options(args),
        )
        handle = serve.run(deployment.bind(config), name=APP_NAME, route_prefix=None)
        worker = RemoteWorker(
            handle, mirror, counters, args.queue_size, args.overload_at, on_stop=lambda: _shutdown(joined)
        )
        listen(APP_NAME, worker.replicas_changed)
        # the first call starts Serve's router in this process, which reports the replicas
        handle.ping.remote().result(timeout_s=FIRST_PING_TIMEOUT_S)
    except BaseException:
        _shutdown(joined)
        raise
    model = {
        "target": args.target,
        "draft_model": args.draft_model,
        "replicas": args.replicas,
        "min_replicas": args.min_replicas,
        "max_replicas": args.max_replicas,
        "gpus_per_replica": args.gpus_per_replica,
        "ray_address": args.ray_address,
    }
    return shared_state(RoutedState, args, worker, mirror, counters, model)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _shutdown(joined_cluster: bool) -> None:
    """Take the replicas down; a local Ray instance started here goes with them."""
    import ray
    from ray import serve

    from serving.membership import stop_listening

    stop_listening(APP_NAME)
    if not ray.is_initialized():
        return
    # Serve's graceful stop waits on its controller and on each replica's drain; a replica that is
    # still loading (one replacing a dead replica) can hold it past any client's patience. Bounded:
    # the local Ray instance started here goes down with ray.shutdown() either way.
    stop = (lambda: serve.delete(APP_NAME)) if joined_cluster else serve.shutdown
    graceful = threading.Thread(target=stop, name="serve-shutdown", daemon=True)
    graceful.start()
    graceful.join(SHUTDOWN_TIMEOUT_S)
    if graceful.is_alive():
        logger.warning("Ray Serve did not stop within %.0f s; taking Ray down", SHUTDOWN_TIMEOUT_S)
    ray.shutdown()
