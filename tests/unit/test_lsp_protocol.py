"""The hardened protocol and the transports' helpers, without a model or a process."""

import argparse
import io
import json
import os

import pytest

from lsp_server.cli import TOKEN_ENV, add_serve_arguments, check_serve_arguments, ws_token
from lsp_server.client import announced_url
from lsp_server.framing import BadFrame, FrameReader, peek_fields
from lsp_server.protocol import SpecCompleteServer
from lsp_server.transport import FdReader, is_loopback, origin_allowed, presented_token, token_matches


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


def test_origin_rules():
    assert origin_allowed(None)  # editors and command-line clients send no Origin
    assert origin_allowed("vscode-file://vscode-app")
    for browser in ("https://evil.example", "null", "http://127.0.0.1:8765", "", "vscode-webview://x"):
        assert not origin_allowed(browser), browser
    assert origin_allowed("https://IDE.example.com/", ("https://ide.example.com",))
    assert not origin_allowed("https://ide.example.com.evil", ("https://ide.example.com",))


def serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser.parse_args(["--target", "tiny-random", *argv])


def test_a_websocket_server_has_a_token_unless_no_token_is_asked_for(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    made, generated = ws_token(serve_args("--ws"))
    assert generated and len(made) >= 20 and made != ws_token(serve_args("--ws"))[0]
    assert ws_token(serve_args("--ws", "--token", "given-token-123")) == ("given-token-123", False)
    assert ws_token(serve_args("--ws", "--no-token")) == (None, False)
    assert "contradict" in check_serve_arguments(serve_args("--ws", "--no-token", "--token", "t" * 12))
    remote = serve_args("--ws", "--no-token", "--host", "0.0.0.0", "--allow-remote")
    assert "loopback only" in check_serve_arguments(remote)
    assert "origin such as" in check_serve_arguments(serve_args("--ws", "--allow-origin", "evil.example"))
    assert check_serve_arguments(serve_args("--ws", "--allow-origin", "https://ide.example.com")) is None


def test_the_announced_url_carries_the_token():
    line = "spec-complete: listening on ws://127.0.0.1:8765/?token=a-b_c (model m, draft d)"
    assert announced_url(line) == "ws://127.0.0.1:8765/?token=a-b_c"
    assert announced_url("spec-complete: listening on ws://[::1]:9/ (model m)") == "ws://[::1]:9"
