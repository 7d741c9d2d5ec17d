"""The hardened protocol and the transports' helpers, without a model or a process."""

import io
import json
import os

import pytest

from lsp_server.framing import BadFrame, FrameReader, peek_fields
from lsp_server.protocol import SpecCompleteServer
from lsp_server.transport import FdReader, is_loopback, presented_token, token_matches


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


def frame(body: bytes, length: int | bytes | None = None) -> bytes:
    value = (
        str(len(body)).encode()
        if length is None
        else str(length).encode()
        if isinstance(length, int)
        else length
    )
    return b"Content-Length: " + value + b"\r\n\r\n" + body


GOOD = b'{"jsonrpc": "2.0", "id": 5, "method": "test/echo"}'


def frames(stream: bytes, max_bytes: int = 1000) -> list:
    reader = FrameReader(io.BytesIO(stream), max_bytes)
    found = []
    while (item := reader.next()) is not None:
        found.append(item)
    return found


@pytest.mark.parametrize(
    "bad",
    [
        frame(b'{"id": 1}', b"-9"),
        frame(b'{"id": 1}', b"nine"),
        frame(b'{"id": 1}', b"9.0"),
        frame(b'{"id": 1}', b""),
        b'Content-Type: x\r\n\r\n{"id": 1}',  # no Content-Length
        b'{"id": 1}\r\n',  # no header at all
        b'Content-Length: 9\r\nnot a header\r\n\r\n{"id": 1}',
    ],
)
def test_a_bad_header_is_reported_and_the_next_frame_is_read(bad):
    found = frames(bad + frame(GOOD))
    assert isinstance(found[0], BadFrame) and "skipped to the next Content-Length" in found[0].reason
    assert found[1:] == [GOOD]


def test_a_length_shorter_than_the_body_loses_only_that_frame():
    found = frames(frame(b'{"id": 1, "method": "x"}', 5) + frame(GOOD))
    assert found[0] == b'{"id"'  # answered as invalid JSON by the protocol
    assert isinstance(found[1], BadFrame)  # the leftover, with the next header glued to it
    assert found[2:] == [GOOD]


def test_a_length_longer_than_the_body_loses_that_frame_and_the_one_it_ran_into():
    found = frames(frame(b'{"id": 1}', 30) + frame(GOOD) + frame(GOOD))
    assert isinstance(found[0], bytes) and found[0].startswith(b'{"id": 1}Content-Length')
    assert found[-1] == GOOD


def test_an_empty_body_is_a_frame_of_its_own():
    assert frames(frame(b"") + frame(GOOD)) == [b"", GOOD]


def test_an_oversized_message_is_skipped_but_its_id_method_and_uri_are_kept():
    big = b'{"jsonrpc": "2.0", "id": 12, "method": "textDocument/didOpen", "params": {"textDocument": '
    big += b'{"uri": "file:///big.py", "text": "' + b"x" * 5000 + b'"}}}'
    found = frames(frame(big) + frame(GOOD), max_bytes=1000)
    assert isinstance(found[0], BadFrame) and "over the" in found[0].reason
    assert (found[0].msg_id, found[0].method, found[0].uri) == (12, "textDocument/didOpen", "file:///big.py")
    assert found[1] == GOOD


def test_peek_fields_reads_only_top_level_members():
    assert peek_fields(b'{"params": {"id": 3, "method": "no"', b'"}}') == (None, None, None)
    assert peek_fields(b'{"method": "a", "params": [', b'1], "id": 9}') == (9, "a", None)
    assert peek_fields(b'{"id": true, "method": 3', b"}") == (None, None, None)
    assert peek_fields(b"[1, 2", b"]") == (None, None, None)


def test_fd_reader_reads_lines_and_exact_lengths():
    read_end, write_end = os.pipe()
    os.write(write_end, b"Content-Length: 3\r\n\r\nabcrest")
    os.close(write_end)
    reader = FdReader(read_end, chunk=4)
    assert FrameReader(reader, 100).next() == b"abc"
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
