"""The sandbox runs generated code in another process, in a temporary folder, with limits."""

import os
import socket

from eval.cases import humaneval_cases, humaneval_program
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
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    try:
        result = run_python(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)")
        assert result.status == "failed"
        assert "ConnectionRefusedError" in result.output_tail  # its own loopback: nobody listens there
    finally:
        listener.close()


def test_every_humaneval_canonical_solution_still_passes():
    failed = [
        case.case_id
        for case in humaneval_cases()
        if not run_python(humaneval_program(case, case.reference)).passed
    ]
    assert failed == []


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
