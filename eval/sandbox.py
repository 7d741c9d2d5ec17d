"""Run untrusted generated code in a separate, limited process: never in the evaluator's own.

Each program runs in a fresh Python interpreter (isolated mode: no user site, no PYTHON* variables)
in a temporary folder that is deleted afterwards, with
- a wall-clock timeout (the whole process group is killed),
- limits on CPU seconds, address space, written file size, open files, and no core dumps, set by
  the child itself before the program's first line (no fork-time hook in this threaded process),
- no network: a new network namespace (only a down loopback) when `unshare -n` works here, and in
  any case a prelude that replaces the socket constructors with ones that raise.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

LAUNCHER = """\
import resource as _resource
for _limit, _value in {limits!r}:
    _resource.setrlimit(_limit, (_value, _value))
import socket as _socket
def _no_network(*args, **kwargs):
    raise OSError("network access is disabled in the evaluation sandbox")
_socket.socket = _no_network
_socket.create_connection = _no_network
_socket.socketpair = _no_network
import runpy
runpy.run_path("program.py", run_name="__main__")
"""


@dataclass(frozen=True, slots=True)
class SandboxResult:
    passed: bool  # exit code 0 within the limits
    status: str  # "passed" | "failed" | "timeout"
    returncode: int | None
    output_tail: str  # the last lines of stdout and stderr, for the report
    network_isolation: str  # "namespace" | "guard"


@functools.cache
def network_namespace_available() -> bool:
    """Can this machine put a child in its own network namespace (root, or user namespaces)?"""
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    for flags in (["-n"], ["-r", "-n"]):
        try:
            probe = subprocess.run([unshare, *flags, "true"], capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            _NAMESPACE_FLAGS[:] = flags
            return True
    return False


_NAMESPACE_FLAGS: list[str] = []


def launcher(cpu_s: int, memory_bytes: int, file_bytes: int) -> str:
    """The script the child starts with: the resource limits, the socket guard, then program.py."""
    import resource

    limits = [
        (resource.RLIMIT_CPU, cpu_s),
        (resource.RLIMIT_AS, memory_bytes),
        (resource.RLIMIT_FSIZE, file_bytes),
        (resource.RLIMIT_NOFILE, 64),
        (resource.RLIMIT_CORE, 0),
    ]
    return LAUNCHER.format(limits=[(int(name), value) for name, value in limits])


def run_python(
    program: str, timeout_s: float = 10.0, memory_mb: int = 1024, file_mb: int = 16, tail_chars: int = 2000
) -> SandboxResult:
    """Run `program` (Python source) in a sandboxed subprocess; passed means it exited with code 0."""
    isolation = "namespace" if network_namespace_available() else "guard"
    with tempfile.TemporaryDirectory(prefix="spec-complete-sandbox-") as folder:
        with open(os.path.join(folder, "program.py"), "w", encoding="utf-8") as handle:
            handle.write(program)
        start = os.path.join(folder, "launch.py")
        with open(start, "w", encoding="utf-8") as handle:
            handle.write(launcher(int(timeout_s) + 1, memory_mb << 20, file_mb << 20))
        command = [sys.executable, "-I", "-B", start]
        if isolation == "namespace":
            command = [shutil.which("unshare") or "unshare", *_NAMESPACE_FLAGS, *command]
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": folder,
            "TMPDIR": folder,
            "LANG": "C.UTF-8",
        }
        process = subprocess.Popen(
            command,
            cwd=folder,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: a timeout kills the program and all it spawned
        )
        try:
            output, _ = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            output, _ = process.communicate()
            return SandboxResult(False, "timeout", None, _tail(output, tail_chars), isolation)
        passed = process.returncode == 0
        status = "passed" if passed else "failed"
        return SandboxResult(passed, status, process.returncode, _tail(output, tail_chars), isolation)


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _tail(output: bytes | None, chars: int) -> str:
    return (output or b"").decode("utf-8", "replace")[-chars:]
