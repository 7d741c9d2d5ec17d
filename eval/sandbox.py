"""Run untrusted generated code in a separate, confined process: never in the evaluator's own.

The default ("bwrap") runs each program with bubblewrap (Debian package `bubblewrap`):
- new user, PID, mount, network, IPC, UTS and cgroup namespaces; the program is uid 65534
  (nobody) inside, and outside too when the evaluator is root (see bwrap_command: as root, uid 0
  outside would not be bound by RLIMIT_NPROC, and owns most files);
- no capabilities (none in the bounding set either), `no_new_privs`, no nested user namespaces;
- a filesystem of its own: /usr (and the /bin, /lib links into it) and the Python installation
  read-only, fresh /proc, /dev and /tmp, and its temporary folder, the only writable host path.
  Nothing else of the host is there: no /home, no /run, no Unix sockets of the host;
- only a loopback of its own: it cannot reach the evaluator's listeners, and the evaluator's
  /proc/<pid>/ns/net is not visible (other PID namespace) nor usable (no CAP_SYS_ADMIN);
- limits on CPU seconds, address space, written file size, open files, processes, no core dumps,
  set by the launcher before the program's first line;
- on timeout the sandbox's PID 1 is killed, which kills every process in its PID namespace
  (`setsid` does not help a child escape), and run_python returns only once they are gone.

When bubblewrap cannot set this up, run_python raises SandboxUnavailable rather than run the code
with less. The weaker "guard" mode (separate process, the same limits, socket constructors that
raise, no namespaces) runs only when asked for: isolation="guard" or SPEC_COMPLETE_SANDBOX=guard.
It is not a security boundary; use it only for code you would run anyway.
"""

from __future__ import annotations

import functools
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

ISOLATION_ENV = "SPEC_COMPLETE_SANDBOX"  # "bwrap" (the default) or "guard"
SANDBOX_UID = 65534  # nobody
MAX_PROCESSES = 64  # RLIMIT_NPROC inside the sandbox
KILL_WAIT_S = 10.0  # how long a killed sandbox may take to be gone

LAUNCHER = """\
import resource as _resource
for _limit, _value in {limits!r}:
    _resource.setrlimit(_limit, (_value, _value))
{guard}
import runpy
runpy.run_path("program.py", run_name="__main__")
"""

# Guard mode only: socket constructors that raise. A program can still undo this (it is Python).
SOCKET_GUARD = """\
def _no_network(*args, **kwargs):
    raise OSError("network access is disabled in the evaluation sandbox")
import _socket, socket as _socket_module
for _module in (_socket, _socket_module):
    for _name in ("socket", "socketpair", "fromfd", "create_connection", "create_server"):
        if hasattr(_module, _name):
            setattr(_module, _name, _no_network)
"""


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot be set up here; the message says what to install or set."""


@dataclass(frozen=True, slots=True)
class SandboxResult:
    passed: bool  # exit code 0 within the limits
    status: str  # "passed" | "failed" | "timeout"
    returncode: int | None
    output_tail: str  # the last lines of stdout and stderr, for the report
    isolation: str  # "bwrap" | "guard"


def launcher(cpu_s: int, memory_bytes: int, file_bytes: int, guard: bool) -> str:
    """The script the child starts with: the resource limits, the socket guard if asked, then program.py."""
    import resource

    limits = [
        (resource.RLIMIT_CPU, cpu_s),
        (resource.RLIMIT_AS, memory_bytes),
        (resource.RLIMIT_FSIZE, file_bytes),
        (resource.RLIMIT_NOFILE, 64),
        (resource.RLIMIT_NPROC, MAX_PROCESSES),
        (resource.RLIMIT_CORE, 0),
    ]
    return LAUNCHER.format(
        limits=[(int(name), value) for name, value in limits], guard=SOCKET_GUARD if guard else ""
    )


def chosen_isolation(isolation: str | None = None) -> str:
    """The isolation asked for: the argument, else $SPEC_COMPLETE_SANDBOX, else "bwrap"."""
    chosen = isolation or os.environ.get(ISOLATION_ENV) or "bwrap"
    if chosen not in ("bwrap", "guard"):
        raise SandboxUnavailable(f"{ISOLATION_ENV}={chosen!r}: choose bwrap (the default) or guard")
    return chosen


def interpreter() -> tuple[str, str]:
    """The real Python binary and its installation prefix (a venv's python is a link to them)."""
    executable = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    return executable, os.path.realpath(sys.base_prefix)


def bwrap_command(folder: str, prefix: str, status_fd: int, as_root: bool) -> list[str]:
    """The bwrap arguments up to the program: namespaces, the read-only system, the writable folder.

    Not root: one bwrap, whose user namespace maps the caller's uid to 65534 inside.
    As root, a user namespace made by root would map the program to uid 0 outside (RLIMIT_NPROC does
    not bind uid 0, and root owns most files). So two steps: an outer bwrap builds the namespaces and
    the filesystem as root, keeping only the capabilities to change user; setpriv becomes nobody
    (uid 65534 outside too) with no capabilities left; an inner bwrap, run by nobody, adds the user
    namespace (65534 inside maps to 65534 outside) and forbids nested ones (--disable-userns).
    """
    bwrap = shutil.which("bwrap") or "bwrap"
    uid = str(SANDBOX_UID)
    user_namespace = ["--unshare-user", "--disable-userns", "--uid", uid, "--gid", uid]
    command = [bwrap]
    if not as_root:
        command += user_namespace
    command += [
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--hostname",
        "sandbox",
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            command += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            command += ["--ro-bind", top, top]
    if not prefix.startswith("/usr/"):  # a Python elsewhere (pyenv under /root): its folders opened to nobody
        parents = [p for p in _ancestors(prefix) if p != "/"]
        for parent in parents:
            command += ["--perms", "0755", "--dir", parent]
        command += ["--ro-bind", prefix, prefix]
    command += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--bind", folder, folder]
    command += ["--chdir", folder, "--json-status-fd", str(status_fd)]
    if as_root:
        command += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP", "--"]
        command += [shutil.which("setpriv") or "/usr/bin/setpriv", f"--reuid={SANDBOX_UID}"]
        command += [f"--regid={SANDBOX_UID}", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"]
        command += ["--no-new-privs", "--", bwrap, *user_namespace, "--bind", "/", "/", "--die-with-parent"]
        command += ["--chdir", folder]
    command += ["--"]
    return command


def _ancestors(path: str) -> list[str]:
    """The folders above `path`, the root first.

    >>> _ancestors("/root/.pyenv/versions")
    ['/', '/root', '/root/.pyenv']
    """
    parents, parent = [], os.path.dirname(path)
    while parent != path:
        parents.append(parent)
        path, parent = parent, os.path.dirname(parent)
    return parents[::-1]


@functools.cache
def bwrap_works() -> str | None:
    """Why bwrap cannot confine a program here, or None when it can (tried once per process)."""
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    result = run_python("print('ok')", timeout_s=30, isolation="bwrap", _probe=True)
    if result.status == "passed" and result.output_tail.strip() == "ok":
        return None
    return f"bwrap could not start a sandbox here: {result.output_tail.strip()[-500:]}"


def run_python(
    program: str,
    timeout_s: float = 10.0,
    memory_mb: int = 1024,
    file_mb: int = 16,
    tail_chars: int = 2000,
    isolation: str | None = None,
    _probe: bool = False,
) -> SandboxResult:
    """Run `program` (Python source) confined; passed means it exited with code 0.

    Raises SandboxUnavailable when the chosen isolation cannot be set up (it never falls back).
    """
    mode = chosen_isolation(isolation)
    if mode == "bwrap" and not _probe and (problem := bwrap_works()) is not None:
        raise SandboxUnavailable(
            f"the evaluation sandbox is unavailable: {problem}. Generated code is not run without it; "
            f"{ISOLATION_ENV}=guard runs it with only process limits and a socket guard "
            "(not a security boundary)"
        )
    executable, prefix = interpreter()
    with tempfile.TemporaryDirectory(prefix="spec-complete-sandbox-") as folder:
        with open(os.path.join(folder, "program.py"), "w", encoding="utf-8") as handle:
            handle.write(program)
        with open(os.path.join(folder, "launch.py"), "w", encoding="utf-8") as handle:
            handle.write(launcher(int(timeout_s) + 1, memory_mb << 20, file_mb << 20, guard=mode == "guard"))
        python = [executable, "-I", "-B", "launch.py"]
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": folder, "TMPDIR": folder, "LANG": "C.UTF-8"}
        if mode == "guard":
            process = _start(python, folder, env, pass_fds=())
            return _finish(process, None, timeout_s, tail_chars, mode)
        return _run_bwrap(python, folder, prefix, env, timeout_s, tail_chars)


def _run_bwrap(
    python: list[str], folder: str, prefix: str, env: dict, timeout_s: float, tail_chars: int
) -> SandboxResult:
    as_root = os.geteuid() == 0
    if as_root:
        os.chown(folder, SANDBOX_UID, SANDBOX_UID)  # its only writable place
        os.chmod(folder, 0o711)  # bwrap, root without capabilities by then, must enter it
    status_read, status_write = os.pipe()
    try:
        command = bwrap_command(folder, prefix, status_write, as_root) + python
        process = _start(command, folder, env, pass_fds=(status_write,))
    finally:
        os.close(status_write)
    with os.fdopen(status_read, "rb") as status:
        # bwrap writes {"child-pid": N, ...} once the sandbox's PID 1 exists; EOF if it failed first.
        # The pipe stays open until bwrap is done: it writes the exit code there last.
        first = status.readline()
        sandbox_pid = json.loads(first).get("child-pid") if first.strip() else None
        return _finish(process, sandbox_pid, timeout_s, tail_chars, "bwrap")


def _start(command: list[str], folder: str, env: dict, pass_fds, **user) -> subprocess.Popen:
    return subprocess.Popen(
        command,
        cwd=folder,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        pass_fds=pass_fds,
        start_new_session=True,  # own process group: a timeout kills bwrap (or the program) and its group
        **user,
    )


def _finish(
    process: subprocess.Popen, sandbox_pid: int | None, timeout_s: float, tail_chars: int, mode: str
) -> SandboxResult:
    # When the program exits, so does PID 1, and the kernel kills what it left behind: only a
    # timeout needs the kill.
    pidfd = _pidfd(sandbox_pid, process.pid)
    try:
        try:
            output, _ = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill(process, pidfd)
            output, _ = process.communicate()
            return SandboxResult(False, "timeout", None, _tail(output, tail_chars), mode)
    finally:
        if pidfd is not None:
            os.close(pidfd)
    passed = process.returncode == 0
    status = "passed" if passed else "failed"
    return SandboxResult(passed, status, process.returncode, _tail(output, tail_chars), mode)


def _pidfd(pid: int | None, parent: int) -> int | None:
    """A pidfd for the sandbox's PID 1, checked to be bwrap's child: a number alone could name
    another process once PID 1 is gone, and the evaluator may be root."""
    if pid is None:
        return None
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:  # already gone
        return None
    try:
        with open(f"/proc/{pid}/status") as status:
            ppid = next((int(line.split()[1]) for line in status if line.startswith("PPid:")), None)
    except OSError:
        ppid = None
    if ppid != parent:
        os.close(pidfd)
        return None
    return pidfd


def _kill(process: subprocess.Popen, pidfd: int | None) -> None:
    """Kill the process group and, with bwrap, the sandbox's PID 1: the kernel then kills every process
    in its PID namespace before PID 1 is gone, so waiting on its pidfd waits for all of them."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if pidfd is None:
        return
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except ProcessLookupError:
        return
    select.select([pidfd], [], [], KILL_WAIT_S)


def _tail(output: bytes | None, chars: int) -> str:
    return (output or b"").decode("utf-8", "replace")[-chars:]
