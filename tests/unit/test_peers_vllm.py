"""The vLLM peers' harness waits for a worker to go idle before the next method runs (no vLLM needed)."""

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eval.peers_vllm import tree_cpu_seconds, wait_until_quiet


class FakeHost:
    """A clock that sleep() moves, and a process that burns a whole core until `busy_until`."""

    def __init__(self, busy_until: float) -> None:
        self.now, self.busy_until = 0.0, busy_until

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def cpu_seconds(self) -> float:
        return min(self.now, self.busy_until)


def test_it_waits_out_a_spin_and_returns_the_wait():
    host = FakeHost(busy_until=1.0)  # vLLM's reader spins for a second after a request
    waited = wait_until_quiet(host.cpu_seconds, window_s=0.1, clock=lambda: host.now, sleep=host.sleep)
    assert 1.0 <= waited <= 1.1 + 1e-9  # the first whole idle window after the spin ends it


def test_an_idle_process_costs_one_window_and_a_spinning_one_at_most_the_limit():
    idle = FakeHost(busy_until=0.0)
    assert wait_until_quiet(idle.cpu_seconds, window_s=0.1, clock=lambda: idle.now, sleep=idle.sleep) == 0.1
    endless = FakeHost(busy_until=float("inf"))
    waited = wait_until_quiet(
        endless.cpu_seconds, window_s=0.1, limit_s=2.0, clock=lambda: endless.now, sleep=endless.sleep
    )
    assert 2.0 <= waited < 2.1 + 1e-9


def test_a_process_trees_cpu_time_counts_its_children():
    spin = "\n".join(
        [
            "import sys, time",
            "t = time.process_time()",
            "while time.process_time() - t < 0.3: pass",
            "print('done', flush=True)",
            "sys.stdin.read()",
        ]
    )
    launcher = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {spin!r}])"
    command = [sys.executable, "-c", launcher]
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as parent:
        try:
            assert parent.stdout.readline() == "done\n"  # the grandchild has used 0.3 s of CPU
            assert tree_cpu_seconds(parent.pid) >= 0.3
        finally:
            parent.stdin.close()  # the grandchild reads to the end of its input, then both exit
            parent.wait(timeout=30)
    assert tree_cpu_seconds(parent.pid) == 0.0  # a process that is gone has used nothing more


FAKE_WORKER = """
import json, subprocess, sys, time
stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # as vLLM's engine core
print("@spec-complete-vllm", json.dumps({"ready": True, "stray": stray.pid}), flush=True)
sys.stdin.read()  # until the benchmark closes it; then exit, leaving the stray behind
"""


def test_closing_the_peers_ends_what_their_workers_started(tmp_path, monkeypatch):
    import psutil

    from eval import peers_vllm

    worker = tmp_path / "fake_worker.py"
    worker.write_text(FAKE_WORKER)
    monkeypatch.setattr(peers_vllm, "WORKER", worker)
    monkeypatch.setattr(peers_vllm.VllmPeers, "_read", lambda self, method: None)  # ready replies read below
    peers = peers_vllm.VllmPeers(sys.executable, tmp_path)
    strays = []
    for process in peers.workers.values():
        line = process.stdout.readline()
        strays.append(psutil.Process(json.loads(line.split(" ", 1)[1])["stray"]))
    peers.close()
    assert not still_running(strays)


def ended(process) -> bool:
    import psutil

    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# A worker as peers_vllm starts it (the real worker's arguments and its group_ends_with), whose engine
# leaves a process behind, as vLLM's engine core would. WAITS: how it waits for requests; POLL: how
# often its watcher looks for the benchmark.
WATCHED_WORKER = """
import json, os, subprocess, sys, time
from eval.vllm_worker import REPLY_MARK, group_ends_with, parse_args
args = parse_args()
with group_ends_with(args.parent_pid, poll_s=POLL):
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(os.path.join(args.model, f"pids-{os.getpid()}.json"), "w") as pids:
        json.dump([os.getpid(), stray.pid], pids)
    print(REPLY_MARK, json.dumps({"ready": True}), flush=True)
    WAITS
"""

# the benchmark: starts the peers, says so, and waits to be killed (SIGKILL: no `finally` runs)
BENCHMARK = """
import sys, time
from pathlib import Path
from eval import peers_vllm
peers_vllm.WORKER = Path(sys.argv[1])
peers = peers_vllm.VllmPeers(sys.executable, sys.argv[2])
print("up", flush=True)
time.sleep(600)
"""

REPO = Path(__file__).resolve().parents[2]


def watched_worker(tmp_path: Path, waits: str, poll_s: float) -> Path:
    worker = tmp_path / "watched_worker.py"
    worker.write_text(WATCHED_WORKER.replace("WAITS", waits).replace("POLL", repr(poll_s)))
    return worker


def written_processes(tmp_path: Path) -> list:
    """The processes whose pids the watched workers wrote (each: itself, then what it left behind),
    taken before anything is killed (psutil then never mistakes a reused pid for one of them)."""
    import psutil

    processes = []
    for path in tmp_path.glob("pids-*.json"):
        for pid in json.loads(path.read_text()):
            with contextlib.suppress(psutil.NoSuchProcess):
                processes.append(psutil.Process(pid))
    return processes


@pytest.mark.parametrize(
    "waits, poll_s",
    [
        # reading its input: a killed benchmark's end of input ends the block (the watcher would
        # look only after 10 minutes)
        ("sys.stdin.read()", 600.0),
        # busy (vLLM starting, a request): only the watcher sees the benchmark gone
        ("time.sleep(600)", 0.05),
    ],
)
def test_a_killed_benchmark_leaves_no_vllm_processes(tmp_path, waits, poll_s):
    worker = watched_worker(tmp_path, waits, poll_s)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    command = [sys.executable, "-c", BENCHMARK, str(worker), str(tmp_path)]
    processes = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO) as benchmark:
        try:
            assert benchmark.stdout.readline() == "up\n"  # its three workers are ready
            processes = written_processes(tmp_path)
        finally:
            benchmark.kill()
            benchmark.wait(timeout=30)
    left = still_running(processes)
    assert len(processes) == 6  # three workers and what each left behind
    assert not left


def still_running(processes: list, timeout_s: float = 30.0) -> list:
    """Those of `processes` (psutil's) that have not ended (gone, or a zombie for init to reap) after
    waiting up to timeout_s; those are then killed, so that a failing test leaves nothing behind."""
    import psutil

    alive, deadline = list(processes), time.monotonic() + timeout_s
    while alive and time.monotonic() < deadline:
        _, alive = psutil.wait_procs(alive, timeout=0.2)
        alive = [process for process in alive if not ended(process)]
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    return alive


def test_a_worker_closed_by_a_live_benchmark_exits_as_it_would(tmp_path, monkeypatch):
    """No kill while the benchmark lives: vLLM exits cleanly (its resource tracker then removes its
    shared memory), and close() ends what is left."""
    from eval import peers_vllm

    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setattr(peers_vllm, "WORKER", watched_worker(tmp_path, "sys.stdin.read()", 0.05))
    peers = peers_vllm.VllmPeers(sys.executable, tmp_path)
    strays = written_processes(tmp_path)[1::2]
    peers.close()
    left = still_running(strays)
    assert [process.returncode for process in peers.workers.values()] == [0, 0, 0]
    assert len(strays) == 3
    assert not left


# Run by hand: the worker is in its launcher's group, not a leader. The launcher passes its own pid
# and exits, so the benchmark is gone when the worker's input ends.
HAND_WORKER = """
import sys
from eval.vllm_worker import group_ends_with
with group_ends_with(int(sys.argv[1]), poll_s=0.05):
    sys.stdin.read()
with open(sys.argv[2], "w") as out:
    out.write("still here")
"""
LAUNCHER = """
import os, subprocess, sys
command = [sys.executable, "-c", sys.argv[1], str(os.getpid()), sys.argv[2]]
print(subprocess.Popen(command, stdin=subprocess.PIPE).pid, flush=True)
"""


def test_a_worker_outside_a_group_of_its_own_kills_no_group(tmp_path):
    """Its group is its launcher's (a shell's, say): nothing is killed, the worker included."""
    import psutil

    out = tmp_path / "out.txt"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    command = [sys.executable, "-c", LAUNCHER, HAND_WORKER, str(out)]
    # the launcher leads a new group, so that a wrong kill would not reach pytest's
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO, start_new_session=True
    ) as launcher:
        worker = psutil.Process(int(launcher.stdout.readline()))
        launcher.wait(timeout=30)  # gone: the worker's input ends and its parent is another
    assert not still_running([worker])
    assert out.read_text() == "still here"
