"""pygls's LSP protocol, hardened: every request gets an answer, whatever arrives.

pygls drops messages it cannot parse or validate without a reply, reads a file from disk when an
edit names an unknown document, exits the process on `exit` and ignores requests after `shutdown`.
`handle_raw` checks each message itself and answers a bad request with a JSON-RPC error; the
builtin document handlers below bypass pygls's workspace (the session keeps the documents).
Notebook documents are not served: pygls would keep their cells in its workspace, outside every
per-client limit. Positions must be integers: cattrs would take 1.5 or true for 1.
"""

from __future__ import annotations

import contextvars
import json
import logging
from collections.abc import Callable
from typing import Any

from cattrs.errors import ClassValidationError
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pygls.lsp.server import LanguageServer
from pygls.protocol.json_rpc import JsonRPCNotification, JsonRPCRequestMessage, JsonRPCResponseMessage
from pygls.protocol.language_server import LanguageServerProtocol, lsp_method

logger = logging.getLogger(__name__)

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = (
    -32700,
    -32600,
    -32601,
    -32602,
    -32603,
)
SERVER_NOT_INITIALIZED = -32002
NOTEBOOK_PREFIX = "notebookDocument/"
UINTEGER_MAX = 2**31 - 1

# The partialResultToken of the request being handled. lsprotocol's InlineCompletionParams has no
# such field (LSP 3.18 gives inline completion none), so it is taken from the raw params.
_partial_result_token: contextvars.ContextVar[int | str | None] = contextvars.ContextVar(
    "partial_result_token", default=None
)


def partial_result_token() -> int | str | None:
    """The current request's partialResultToken, if the client sent one."""
    return _partial_result_token.get()


class RequestFailed(JsonRpcException):
    """LSP RequestFailed: the request was valid, but the server could not do it (busy, refused document)."""

    CODE = types.LSPErrorCodes.RequestFailed.value


class ServerCancelled(JsonRpcException):
    """LSP ServerCancelled: the server dropped the request (superseded, document closed)."""

    CODE = types.LSPErrorCodes.ServerCancelled.value


class RequestCancelled(JsonRpcException):
    CODE = types.LSPErrorCodes.RequestCancelled.value


class SpecCompleteProtocol(LanguageServerProtocol):
    def __init__(self, server: LanguageServer, converter) -> None:
        super().__init__(server, converter)
        converter.register_structure_hook(types.Position, _strict_position)
        self.initialized = False
        self.on_exit: Callable[[int], None] | None = None  # the transport closes the connection

    # -- entry point for every message ----------------------------------------------------------

    def handle_raw(self, body: bytes | str) -> None:
        """Parse, check and dispatch one JSON-RPC message; answer a bad request with an error."""
        try:
            data = json.loads(body)
        except (ValueError, RecursionError) as error:
            self.reply_error(None, PARSE_ERROR, f"not valid JSON: {str(error)[:200]}")
            return
        if not isinstance(data, dict):
            self.reply_error(
                None, INVALID_REQUEST, "a JSON-RPC message must be an object (batches are not supported)"
            )
            return
        has_id, msg_id, method = "id" in data, data.get("id"), data.get("method")
        if has_id and not _valid_id(msg_id):
            if "method" in data:
                self.reply_error(None, INVALID_REQUEST, "id must be an integer or a string")
            return
        if data.get("jsonrpc") != "2.0":
            if has_id and "method" in data:
                self.reply_error(msg_id, INVALID_REQUEST, 'jsonrpc must be "2.0"')
            return
        if "method" not in data:
            if has_id:
                self._client_response(data)
            return
        if not isinstance(method, str):
            if has_id:
                self.reply_error(msg_id, INVALID_REQUEST, "method must be a string")
            return
        if has_id:
            self._request(msg_id, method, data)
        else:
            self._notification(method, data)

    def reply_error(self, msg_id: int | str | None, code: int, message: str) -> None:
        self._send_data({"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}})

    def _request(self, msg_id: int | str, method: str, data: dict) -> None:
        if method != types.INITIALIZE and not self.initialized:
            self.reply_error(
                msg_id, SERVER_NOT_INITIALIZED, f"{method} before initialize: send initialize first"
            )
            return
        if method == types.INITIALIZE and self.initialized:
            self.reply_error(msg_id, INVALID_REQUEST, "initialize was already called on this connection")
            return
        if self._shutdown:
            self.reply_error(
                msg_id, INVALID_REQUEST, f"{method} after shutdown: the server only accepts exit now"
            )
            return
        if not self._knows(method):
            self.reply_error(msg_id, METHOD_NOT_FOUND, f"unknown method {method[:100]!r}")
            return
        if _is_notification(method):
            self.reply_error(msg_id, INVALID_REQUEST, f"{method} is a notification: send it without an id")
            return
        data.setdefault("params", None)
        try:
            message = self._converter.structure(data, self.get_message_type(method) or JsonRPCRequestMessage)
        except Exception as error:
            self.reply_error(msg_id, INVALID_PARAMS, f"invalid params for {method}: {describe(error)}")
            return
        params = data.get("params")
        token = params.get("partialResultToken") if isinstance(params, dict) else None
        reset = _partial_result_token.set(token if _valid_id(token) else None)
        try:
            self.handle_message(message)
        except Exception as error:
            logger.exception("request %r failed", method)
            self.reply_error(msg_id, INTERNAL_ERROR, f"{method} failed: {error}")
        finally:
            _partial_result_token.reset(reset)

    def _notification(self, method: str, data: dict) -> None:
        if method != types.EXIT and (not self.initialized or self._shutdown):
            logger.debug("dropped notification %r (not initialized or shut down)", method)
            return
        if method != types.CANCEL_REQUEST and not self._knows(method):
            logger.debug("ignored unknown notification %r", method)
            return
        data.setdefault("params", None)
        try:
            message = self._converter.structure(data, self.get_message_type(method) or JsonRPCNotification)
            self.handle_message(message)
        except Exception as error:
            logger.info("dropped notification %r: %s", method, describe(error))

    def _client_response(self, data: dict) -> None:
        try:
            if "error" in data:
                message = self._converter.structure(data, types.ResponseErrorMessage)
            else:
                message = self._converter.structure(
                    {**data, "result": data.get("result")}, JsonRPCResponseMessage
                )
            self.handle_message(message)
        except Exception as error:
            logger.info("dropped a response from the client: %s", describe(error))

    def _knows(self, method: str) -> bool:
        if method.startswith(NOTEBOOK_PREFIX):
            return False
        return method in self.fm.features or method in self.fm.builtin_features

    # -- builtin handlers pygls would otherwise run ----------------------------------------------

    @lsp_method(types.INITIALIZE)
    def lsp_initialize(self, params: types.InitializeParams):
        result = yield from super().lsp_initialize(params)
        self.initialized = True
        return result

    @lsp_method(types.EXIT)
    def lsp_exit(self, *args) -> None:
        if self.on_exit is not None:
            self.on_exit(0 if self._shutdown else 1)

    @lsp_method(types.TEXT_DOCUMENT_DID_OPEN)
    def lsp_text_document__did_open(self, params: types.DidOpenTextDocumentParams):
        yield from self._user_handler(types.TEXT_DOCUMENT_DID_OPEN, params)

    @lsp_method(types.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params: types.DidChangeTextDocumentParams):
        yield from self._user_handler(types.TEXT_DOCUMENT_DID_CHANGE, params)

    @lsp_method(types.TEXT_DOCUMENT_DID_CLOSE)
    def lsp_text_document__did_close(self, params: types.DidCloseTextDocumentParams):
        yield from self._user_handler(types.TEXT_DOCUMENT_DID_CLOSE, params)

    def _user_handler(self, method: str, params: Any):
        if (handler := self.fm.features.get(method)) is not None:
            yield handler, (params,), None


class SpecCompleteServer(LanguageServer):
    """A pygls LanguageServer on the hardened protocol; errors are logged, never echoed back as messages."""

    protocol: SpecCompleteProtocol

    def __init__(self, name: str, version: str) -> None:
        super().__init__(name, version, protocol_cls=SpecCompleteProtocol)

    def report_server_error(self, error: Exception, source: Any) -> None:
        logger.info("%s: %s", getattr(source, "__name__", source), error)


def describe(error: BaseException) -> str:
    """A short reason for a structuring error: the innermost messages, not a traceback."""
    while isinstance(error, JsonRpcException) and error.__cause__ is not None:
        error = error.__cause__
    if isinstance(error, ClassValidationError):
        from cattrs import transform_error

        return "; ".join(transform_error(error))[:300]
    return f"{type(error).__name__}: {error}"[:300]


def _is_notification(method: str) -> bool:
    """An LSP method that has no response type: a notification."""
    known = types.METHOD_TO_TYPES.get(method)
    return known is not None and known[1] is None


def _strict_position(value: object, _type: type) -> types.Position:
    """An LSP Position whose line and character are integers (uinteger: 0 to 2**31 - 1), nothing else."""
    if not isinstance(value, dict):
        raise ValueError(f"a position must be an object with line and character, not {value!r:.40}")
    fields = (value.get("line"), value.get("character"))
    for name, field in zip(("line", "character"), fields, strict=True):
        if isinstance(field, bool) or not isinstance(field, int) or not 0 <= field <= UINTEGER_MAX:
            raise ValueError(
                f"position.{name} must be an integer from 0 to {UINTEGER_MAX}, not {field!r:.40}"
            )
    return types.Position(*fields)


def _valid_id(value: object) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))
