"""Building the row-invariant kernel: a build stopped midway never leaves later loads waiting forever."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from completion_engine import row_invariant
from completion_engine.row_invariant import build_lock

fcntl = pytest.importorskip("fcntl", reason="the kernel is built on Linux only")


def test_a_lock_left_by_a_stopped_build_is_removed(tmp_path):
    (tmp_path / "lock").touch()  # what torch's loader leaves when its process is killed mid-build
    with build_lock(tmp_path, wait_s=10) as held:
        assert held
        assert not (tmp_path / "lock").exists()


def test_a_live_build_keeps_its_lock_and_one_held_too_long_is_given_up(tmp_path):
    (tmp_path / "lock").touch()
    with open(tmp_path / "build.flock", "a") as other:  # another live process building
        fcntl.flock(other, fcntl.LOCK_EX)
        with build_lock(tmp_path, wait_s=0.2) as held:
            assert not held
        assert (tmp_path / "lock").exists()  # its lock is its own: left alone
        fcntl.flock(other, fcntl.LOCK_UN)
    with build_lock(tmp_path, wait_s=10) as held:
        assert held


def test_a_killed_holder_lets_the_next_process_in(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from completion_engine.row_invariant import build_lock\n"
            f"with build_lock(Path({str(tmp_path)!r})) as held:\n"
            "    print(held, flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "True"
        (tmp_path / "lock").touch()  # as if it had started torch's build
        holder.kill()
        holder.wait(timeout=30)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=30)
    with build_lock(tmp_path, wait_s=10) as held:
        assert held
        assert not (tmp_path / "lock").exists()


def test_the_next_load_after_a_killed_build_gets_the_kernel():
    """The regression: a process stopped mid-build left torch's lock file, and every later load hung."""
    if row_invariant.kernel() is None:
        pytest.skip("the kernel does not build here")
    stale = row_invariant.build_directory() / "lock"
    stale.touch()
    try:
        loaded = subprocess.run(
            [
                sys.executable,
                "-c",
                "from completion_engine import row_invariant; print(row_invariant.kernel() is not None)",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        removed = not stale.exists()
    finally:
        stale.unlink(missing_ok=True)
    assert loaded.stdout.strip() == "True", loaded.stderr[-2000:]
    assert removed


def test_a_build_held_too_long_elsewhere_falls_back_to_torchs_kernels(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("SPEC_COMPLETE_CACHE", str(tmp_path))
    monkeypatch.setattr(row_invariant, "BUILD_WAIT_S", 0.2)
    directory = row_invariant.build_directory()
    directory.mkdir(parents=True)
    with open(directory / "build.flock", "a") as other:  # a live build that never ends
        fcntl.flock(other, fcntl.LOCK_EX)
        assert row_invariant._build() is None
    assert "another process held" in caplog.text


def test_a_read_only_cache_falls_back_to_torchs_kernels(monkeypatch, tmp_path, caplog):
    if os.geteuid() == 0:
        read_only = tmp_path / "file"  # root writes anywhere: a cache path under a file fails the same way
        read_only.write_text("")
    else:
        read_only = tmp_path / "ro"
        read_only.mkdir(mode=0o555)
    monkeypatch.setenv("SPEC_COMPLETE_CACHE", str(read_only))
    assert row_invariant._build() is None
    assert "cannot build in its cache" in caplog.text
