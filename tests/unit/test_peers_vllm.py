"""The vLLM peers' harness waits for a worker to go idle before the next method runs (no vLLM needed)."""

import json
import subprocess
import sys
import time

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
    alive, deadline = strays, time.monotonic() + 30
    while alive and time.monotonic() < deadline:  # ended: gone, or a zombie for init to reap
        _, alive = psutil.wait_procs(alive, timeout=0.2)
        alive = [process for process in alive if not ended(process)]
    assert not alive, f"left running: {alive}"


def ended(process) -> bool:
    import psutil

    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
