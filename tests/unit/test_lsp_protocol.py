"""The hardened protocol and the transports' helpers, without a model or a process."""

import io
import json
import os

import pytest

from lsp_server.protocol import SpecCompleteServer
from lsp_server.transport import TOO_LARGE, FdReader, is_loopback, presented_token, read_framed, token_matches


class Capture:
    def __init__(self):
        self.sent = []

    def write(self, data: bytes) -> None:
        self.sent.append(json.loads(data))


@pytest.fixture
def server():
    server = SpecCompleteServer("test", "0")

    @server.feature("test/echo")
    def echo(ls, params):
        return params

    capture = Capture()
    server.protocol.set_writer(capture, include_headers=False)
    server.capture = capture
    return server


def send(server, message) -> list[dict]:
    server.capture.sent.clear()
    server.protocol.handle_raw(message if isinstance(message, str) else json.dumps(message))
    return server.capture.sent


def error(sent: list[dict]) -> tuple[object, int]:
    (reply,) = sent
    return reply["id"], reply["error"]["code"]


def test_broken_json_and_non_objects_get_errors_with_a_null_id(server):
    assert error(send(server, '{"jsonrpc": "2.0", "id": 1,')) == (None, -32700)
    assert error(send(server, "[1, 2]")) == (None, -32600)
    assert error(send(server, {"jsonrpc": "2.0", "id": [1], "method": "x"})) == (None, -32600)
    assert send(server, {"jsonrpc": "2.0", "method": "x"}) == []  # a notification is never answered


def test_requests_before_initialize_and_unknown_methods(server):
    assert error(send(server, {"jsonrpc": "2.0", "id": 1, "method": "test/echo"})) == (1, -32002)
    send(server, {"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {"capabilities": {}}})
    assert server.protocol.initialized
    assert send(server, {"jsonrpc": "2.0", "id": 3, "method": "test/echo", "params": [7]})[0]["result"] == [7]
    assert error(send(server, {"jsonrpc": "2.0", "id": 4, "method": "no/such"})) == (4, -32601)
    assert error(send(server, {"jsonrpc": "2.0", "id": 5, "method": "initialize", "params": {}})) == (
        5,
        -32600,
    )
    assert error(send(server, {"jsonrpc": "2.0", "id": 6, "method": "exit"})) == (6, -32600)
    assert error(send(server, {"jsonrpc": "1.0", "id": 7, "method": "test/echo"})) == (7, -32600)


def test_invalid_params_name_the_field(server):
    send(server, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"capabilities": {}}})
    sent = send(server, {"jsonrpc": "2.0", "id": 2, "method": "shutdown", "params": None})
    assert sent[0]["id"] == 2 and "error" not in sent[0]
    assert error(send(server, {"jsonrpc": "2.0", "id": 3, "method": "test/echo"})) == (3, -32600)  # shut down


def test_read_framed_skips_oversized_bodies_and_survives_junk_headers():
    body = b'{"a": 1}'
    stream = io.BytesIO(
        b"Junk: 1\r\n\r\n"  # a header block without a length is skipped
        + b"Content-Length: 20\r\n\r\n"
        + b"x" * 20  # over the limit of 10: read and dropped
        + b"Content-Length: %d\r\nContent-Type: x\r\n\r\n" % len(body)
        + body
    )
    assert read_framed(stream, max_bytes=10) is TOO_LARGE
    assert read_framed(stream, max_bytes=10) == body
    assert read_framed(stream, max_bytes=10) is None


def test_fd_reader_reads_lines_and_exact_lengths():
    read_end, write_end = os.pipe()
    os.write(write_end, b"Content-Length: 3\r\n\r\nabcrest")
    os.close(write_end)
    reader = FdReader(read_end, chunk=4)
    assert read_framed(reader, 100) == b"abc"
    assert reader.read(100) == b"rest"
    assert reader.readline() == b""
    os.close(read_end)


def test_token_rules():
    assert presented_token("/?token=s3cret", None) == "s3cret"
    assert presented_token("/", "Bearer s3cret") == "s3cret"
    assert presented_token("/", "Basic abc") is None
    assert token_matches("s3cret", "s3cret") and not token_matches(None, "s3cret")
    assert is_loopback("127.0.0.2") and is_loopback("[::1]") and not is_loopback("10.0.0.1")
    assert not is_loopback("example.com")
