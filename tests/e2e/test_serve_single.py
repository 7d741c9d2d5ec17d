"""`serve` without --replicas: the single-process path stays free of Ray (and torch, in the front end)."""

from __future__ import annotations

import subprocess
import sys


def test_single_process_serve_does_not_import_ray():
    code = (
        "import sys, lsp_server.cli, lsp_server.transport, lsp_server.session, lsp_server.worker;"
        "assert 'ray' not in sys.modules and 'torch' not in sys.modules, 'imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_replicas_need_websocket():
    done = subprocess.run(
        [sys.executable, "-m", "lsp_server", "--target", "tiny-random", "--stdio", "--replicas", "2"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "--replicas needs --ws" in done.stderr


def test_replicas_that_do_not_fit_the_local_cpus_are_refused_before_ray_starts():
    done = subprocess.run(
        [sys.executable, "-m", "lsp_server", "--target", "tiny-random", "--ws", "--replicas", "3",
         "--ray-cpus", "2", "--cpus-per-replica", "1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "--cpus-per-replica 0.666667" in done.stderr
