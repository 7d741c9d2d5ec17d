"""Generated code tries to get out of the evaluation sandbox; every attempt must fail.

Each program below exits 0 only if its escape worked, so `passed` would mean a hole; each test also
checks the host side (no file written, no connection accepted, no process left). These tests need
bubblewrap: without it run_python raises SandboxUnavailable and they fail, never skip.
"""

from __future__ import annotations

import os
import socket
import textwrap
import uuid

import pytest

from eval import sandbox
from eval.sandbox import SANDBOX_UID, SandboxUnavailable, run_python


def run(program: str, **kwargs) -> sandbox.SandboxResult:
    return run_python(textwrap.dedent(program), **kwargs)


@pytest.fixture
def loopback_listener():
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    yield listener
    listener.close()


def accepted_nothing(listener: socket.socket) -> bool:
    try:
        connection, _ = listener.accept()
    except BlockingIOError:
        return True
    connection.close()
    return False


def test_runs_as_nobody_without_capabilities_or_new_privileges():
    result = run("""
        import os
        status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
        print(os.getuid(), os.getgid(), status["CapEff"].strip(), status["CapBnd"].strip(),
              status["NoNewPrivs"].strip(), os.getpid())
    """)
    assert result.passed, result.output_tail
    assert result.isolation == "bwrap"
    uid, gid, effective, bounding, no_new_privs, pid = result.output_tail.split()
    assert (int(uid), int(gid)) == (SANDBOX_UID, SANDBOX_UID)
    assert int(effective, 16) == 0 and int(bounding, 16) == 0
    assert no_new_privs == "1"
    assert int(pid) < 10  # its own PID namespace


def test_lives_in_a_user_namespace_that_maps_nobody_to_nobody_and_cannot_nest_one():
    result = run("""
        import ctypes, os, sys
        print(" ".join(open("/proc/self/uid_map").read().split()))
        CLONE_NEWUSER = 0x10000000
        libc = ctypes.CDLL(None, use_errno=True)
        sys.exit(0 if libc.unshare(CLONE_NEWUSER) == 0 else 1)
    """)
    assert not result.passed, "a nested user namespace was created"
    inside, parent, count = result.output_tail.split("\n")[0].split()
    assert (inside, count) == (str(SANDBOX_UID), "1")
    if os.geteuid() == 0:  # not root outside (a non-root caller's bwrap nests a namespace of its own)
        assert parent == str(SANDBOX_UID)


def test_cannot_write_outside_its_folder(tmp_path):
    os.chmod(tmp_path, 0o777)  # even a folder anyone may write to
    name = f"escaped-{uuid.uuid4().hex}.txt"
    host_paths = [str(tmp_path / name), f"/usr/{name}", f"/tmp/{name}", f"/{name}"]
    result = run(f"""
        import sys
        wrote = []
        for path in {host_paths!r}:
            try:
                open(path, "w").write("x")
                wrote.append(path)
            except OSError as error:
                print(path, error)
        sys.exit(0 if {host_paths[0]!r} in wrote or {host_paths[1]!r} in wrote else 1)
    """)
    assert not result.passed, result.output_tail
    leaked = [path for path in host_paths if os.path.exists(path)]
    for path in leaked:  # clean up before failing: a hole must not leave files behind
        os.remove(path)
    assert leaked == []


def test_cannot_read_the_hosts_files(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("payroll")
    os.chmod(secret, 0o644)
    result = run(f"print(open({str(secret)!r}).read())")
    assert not result.passed
    assert "payroll" not in result.output_tail


def test_cannot_fork_without_bound():
    result = run("""
        import os, sys, time
        children = 0
        try:
            for _ in range(500):
                if os.fork() == 0:
                    time.sleep(3)
                    os._exit(0)
                children += 1
        except OSError as error:
            print("fork refused after", children, error)
            sys.exit(1)
    """)
    assert not result.passed
    assert "fork refused after" in result.output_tail
    assert int(result.output_tail.split("after")[1].split()[0]) < sandbox.MAX_PROCESSES


def test_a_setsid_child_does_not_outlive_the_timeout():
    marker = f"sandbox-escapee-{uuid.uuid4().hex}"
    result = run(
        f"""
        import os
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                devnull = os.open("/dev/null", os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(devnull, fd)
                os.execv("/usr/bin/sleep", [{marker!r}, "600"])
            os._exit(0)
        os.wait()
        print("spawned", flush=True)
        while True:
            pass
        """,
        timeout_s=5,  # room to start and print "spawned" on a busy host; it spins till then anyway
    )
    assert result.status == "timeout"
    assert "spawned" in result.output_tail
    assert not [pid for pid in _host_pids() if marker.encode() in _cmdline(pid)]


def test_cannot_join_the_evaluators_network_namespace(loopback_listener):
    port = loopback_listener.getsockname()[1]
    result = run(f"""
        import ctypes, os, socket, sys
        CLONE_NEWNET = 0x40000000
        libc = ctypes.CDLL(None, use_errno=True)
        for pid in ({os.getpid()}, 1):
            try:
                fd = os.open(f"/proc/{{pid}}/ns/net", os.O_RDONLY)
            except OSError as error:
                print("open", pid, error)
                continue
            if libc.setns(fd, CLONE_NEWNET) == 0:
                print("joined", pid)
        try:
            socket.create_connection(("127.0.0.1", {port}), timeout=2)
        except OSError as error:
            print("connect", error)
            sys.exit(1)
    """)
    assert not result.passed, result.output_tail
    assert "joined" not in result.output_tail
    assert accepted_nothing(loopback_listener)


def test_cannot_reach_a_unix_socket_on_the_host(tmp_path):
    os.chmod(tmp_path, 0o777)
    path = str(tmp_path / "host.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o777)  # anyone on the host may connect: only the sandbox can stop it
    listener.listen(1)
    listener.setblocking(False)
    try:
        result = run(f"""
            import socket
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.connect({path!r})
        """)
        assert not result.passed, result.output_tail
        assert accepted_nothing(listener)
    finally:
        listener.close()


def test_guard_mode_also_stops_the_raw_socket_module(loopback_listener):
    port = loopback_listener.getsockname()[1]
    result = run(
        f"""
        import _socket
        client = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        client.connect(("127.0.0.1", {port}))
        """,
        isolation="guard",
    )
    assert not result.passed
    assert result.isolation == "guard"
    assert "network access is disabled" in result.output_tail
    assert accepted_nothing(loopback_listener)


def test_without_bubblewrap_it_refuses_to_run(monkeypatch, tmp_path):
    marker = tmp_path / "ran"
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    sandbox.bwrap_works.cache_clear()
    try:
        with pytest.raises(SandboxUnavailable, match="bubblewrap is not installed"):
            run_python(f"open({str(marker)!r}, 'w')")
    finally:
        sandbox.bwrap_works.cache_clear()
    assert not marker.exists()


def test_an_unknown_isolation_is_refused(monkeypatch):
    monkeypatch.setenv(sandbox.ISOLATION_ENV, "none")
    with pytest.raises(SandboxUnavailable, match="choose bwrap"):
        run_python("print(1)")


def _host_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read()
    except OSError:
        return b""
