"""The replica flags of `serve`: fixed --replicas or autoscaling bounds, refused with a clear reason."""

from __future__ import annotations

import argparse

import pytest

from lsp_server.cli import add_serve_arguments, check_serve_arguments
from serving.launch import scaling_options

BASE = ["--target", "tiny-random", "--ws", "--ray-cpus", "4", "--cpus-per-replica", "1"]


def parsed(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser.parse_args([*BASE, *flags])


@pytest.mark.parametrize(
    ("flags", "reason"),
    [
        (["--min-replicas", "2"], "--min-replicas is an autoscaling bound: it needs --max-replicas"),
        (["--replicas", "2", "--upscale-delay-s", "5"], "--upscale-delay-s is an autoscaling bound"),
        (["--min-replicas", "3", "--max-replicas", "2"], "--max-replicas (2) is below --min-replicas (3)"),
        (["--min-replicas", "0", "--max-replicas", "2"], "--min-replicas must be at least 1"),
        (["--replicas", "4", "--max-replicas", "3"], "--replicas 4 (the replicas to start with) is outside"),
        (["--max-replicas", "2", "--target-ongoing-requests", "0"], "--target-ongoing-requests must be"),
        (["--max-replicas", "5"], "5 replicas x 1 CPUs do not fit the 4 CPUs"),  # the bound must fit
    ],
)
def test_bad_replica_flags_say_what_is_wrong(flags, reason):
    assert reason in check_serve_arguments(parsed(*flags))


def test_fixed_replicas_map_to_a_fixed_count():
    args = parsed("--replicas", "3")
    assert check_serve_arguments(args) is None
    assert scaling_options(args) == {"num_replicas": 3}


def test_bounds_map_to_ray_serves_autoscaling_config_with_its_defaults():
    args = parsed("--max-replicas", "4")
    assert check_serve_arguments(args) is None
    assert scaling_options(args) == {
        "autoscaling_config": {
            "min_replicas": 1,
            "max_replicas": 4,
            "initial_replicas": None,
            "target_ongoing_requests": 2.0,
            "upscale_delay_s": 30.0,
            "downscale_delay_s": 600.0,
        }
    }
    started = parsed(
        "--replicas", "2", "--min-replicas", "1", "--max-replicas", "3", "--upscale-delay-s", "0"
    )
    assert check_serve_arguments(started) is None
    config = scaling_options(started)["autoscaling_config"]
    assert (config["initial_replicas"], config["upscale_delay_s"]) == (2, 0.0)
