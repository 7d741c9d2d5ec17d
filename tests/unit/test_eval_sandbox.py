"""The sandbox runs generated code in another process, in a temporary folder, with limits."""

import os

from eval.sandbox import run_python


def test_a_passing_and_a_failing_program():
    assert run_python("print('ok')").status == "passed"
    failed = run_python("assert 1 == 2")
    assert failed.status == "failed"
    assert "AssertionError" in failed.output_tail


def test_a_program_past_its_time_is_killed():
    result = run_python("while True:\n    pass\n", timeout_s=1)
    assert result.status == "timeout"
    assert not result.passed


def test_memory_is_limited():
    result = run_python("block = bytearray(3 << 30)", memory_mb=256)
    assert result.status == "failed"
    assert "MemoryError" in result.output_tail


def test_network_is_off():
    result = run_python("import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)")
    assert result.status == "failed"
    assert (
        "network access is disabled" in result.output_tail or "Network is unreachable" in result.output_tail
    )


def test_the_program_runs_in_a_temporary_folder_that_is_removed(tmp_path):
    result = run_python("import os\nopen('left.txt', 'w').write('x')\nprint(os.getcwd())")
    assert result.passed
    folder = result.output_tail.strip()
    assert folder != os.getcwd()
    assert not os.path.exists(folder)


def test_the_evaluator_process_is_untouched():
    before = os.environ.get("SPEC_COMPLETE_SANDBOX_PROBE")
    result = run_python("import os, sys\nos.environ['SPEC_COMPLETE_SANDBOX_PROBE'] = '1'\nsys.exit(3)")
    assert result.returncode == 3
    assert os.environ.get("SPEC_COMPLETE_SANDBOX_PROBE") == before
