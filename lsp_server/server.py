"""The LSP handlers of one connection; the work happens in session.py, worker.py and results.py."""

from __future__ import annotations

from collections.abc import Callable

from lsprotocol import types
from pygls.exceptions import JsonRpcInternalError, JsonRpcInvalidParams
from pygls.protocol import default_converter

from lsp_server.documents import DocumentError, TextChange
from lsp_server.protocol import RequestFailed, ServerCancelled, SpecCompleteServer, partial_result_token
from lsp_server.results import (
    ACCEPT_COMMAND,
    accept_command,
    accepted_length,
    completion_result,
    inline_result,
    reported_item,
    suggestion_ref,
)
from lsp_server.session import (
    ClientSession,
    Completion,
    CompletionCancelled,
    CompletionFailed,
    SuggestionError,
)
from lsp_server.settings import InvalidOptions
from lsp_server.worker import ServerBusy

SERVER_NAME = "spec-complete"
SERVER_VERSION = "0.1.0"
STATS_METHOD = "specComplete/stats"
# Copilot's language server takes these two notifications; the item they carry is one we answered
SHOWN_METHOD = "textDocument/didShowCompletion"
PARTIALLY_ACCEPTED_METHOD = "textDocument/didPartiallyAcceptCompletion"
_CONVERTER = default_converter()


def build_server(session: ClientSession) -> SpecCompleteServer:
    server = SpecCompleteServer(SERVER_NAME, SERVER_VERSION)

    @server.feature(types.INITIALIZE)
    def initialize(ls: SpecCompleteServer, params: types.InitializeParams) -> None:
        encoding = ls.workspace.position_encoding
        try:
            session.configure(params.initialization_options, getattr(encoding, "value", encoding))
        except InvalidOptions as error:
            raise JsonRpcInvalidParams(f"initializationOptions: {error}") from None

    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    def did_change_configuration(ls: SpecCompleteServer, params: types.DidChangeConfigurationParams) -> None:
        settings = params.settings
        if isinstance(settings, dict) and isinstance(settings.get("specComplete"), dict):
            settings = settings["specComplete"]
        try:
            session.configure(settings)
        except InvalidOptions as error:
            _warn(ls, f"settings not applied: {error}")

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: SpecCompleteServer, params: types.DidOpenTextDocumentParams) -> None:
        doc = params.text_document
        refused = session.open(doc.uri, doc.text, doc.version, doc.language_id)
        if refused:
            _warn(ls, refused)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: SpecCompleteServer, params: types.DidChangeTextDocumentParams) -> None:
        changes = [_text_change(change) for change in params.content_changes]
        try:
            refused = session.change(params.text_document.uri, params.text_document.version, changes)
        except DocumentError as error:
            refused = str(error)
        if refused:
            _warn(ls, refused)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: SpecCompleteServer, params: types.DidCloseTextDocumentParams) -> None:
        session.close(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
    async def inline_completion(
        ls: SpecCompleteServer, params: types.InlineCompletionParams
    ) -> types.InlineCompletionList:
        completion = await _complete(ls, session, params.text_document.uri, params.position, _inline)
        return _inline(completion)

    @server.feature(types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions())
    async def completion(ls: SpecCompleteServer, params: types.CompletionParams) -> types.CompletionList:
        built = _completion_list(session.documents.encoding)
        completion = await _complete(ls, session, params.text_document.uri, params.position, built)
        return built(completion)

    @server.feature(STATS_METHOD)
    def stats(ls: SpecCompleteServer, params: object) -> dict:
        return session.shared.stats(session)

    @server.feature(SHOWN_METHOD)
    def did_show(ls: SpecCompleteServer, params: object) -> None:
        try:
            suggestion, _ = reported_item(_plain(params))
        except ValueError as error:
            _warn(ls, f"{SHOWN_METHOD}: {error}")
            return
        session.shown(suggestion)

    @server.feature(PARTIALLY_ACCEPTED_METHOD)
    def did_partially_accept(ls: SpecCompleteServer, params: object) -> None:
        try:
            plain = _plain(params)
            suggestion, skipped = reported_item(plain)
            session.accepted(suggestion, skipped, accepted_length(plain))
        except ValueError as error:  # SuggestionError included
            _warn(ls, f"{PARTIALLY_ACCEPTED_METHOD}: {error}")

    @server.command(ACCEPT_COMMAND)
    def did_accept(ls: SpecCompleteServer, *arguments: object) -> None:
        try:
            suggestion, skipped = suggestion_ref(list(arguments))
            session.accepted(suggestion, skipped)
        except (ValueError, SuggestionError) as error:
            raise JsonRpcInvalidParams(f"{ACCEPT_COMMAND}: {error}") from None

    return server


def _inline(completion: Completion) -> types.InlineCompletionList:
    return inline_result(
        completion.text, completion.position, accept_command(completion.suggestion, completion.skipped)
    )


def _completion_list(encoding: str) -> Callable[[Completion], types.CompletionList]:
    def build(completion: Completion) -> types.CompletionList:
        return completion_result(
            completion.text,
            completion.cursor.line_prefix,
            completion.position,
            encoding,
            accept_command(completion.suggestion, completion.skipped),
        )

    return build


async def _complete(
    ls: SpecCompleteServer, session: ClientSession, uri: str, position: types.Position, build: Callable
) -> Completion:
    """Run a completion, streaming partial results when the client asked; map failures to LSP errors."""
    token = partial_result_token()

    def send_partial(partial: Completion) -> None:
        value = _CONVERTER.unstructure(build(partial))
        ls.protocol.notify(types.PROGRESS, types.ProgressParams(token=token, value=value))

    try:
        return await session.complete(uri, position, send_partial if token is not None else None)
    except DocumentError as error:
        raise (RequestFailed if error.refused else JsonRpcInvalidParams)(str(error)) from None
    except ServerBusy as error:
        raise RequestFailed(str(error)) from None
    except CompletionCancelled as error:
        raise ServerCancelled(f"completion cancelled: {error}") from None
    except CompletionFailed as error:
        raise JsonRpcInternalError(str(error)) from None


def _text_change(change: types.TextDocumentContentChangeEvent) -> TextChange:
    if isinstance(change, types.TextDocumentContentChangePartial):
        start, end = change.range.start, change.range.end
        return TextChange(change.text, ((start.line, start.character), (end.line, end.character)))
    return TextChange(change.text)


def _plain(value: object) -> object:
    """pygls hands a custom notification's params over as namedtuples: back to plain JSON values."""
    if hasattr(value, "_asdict"):
        return {key: _plain(item) for key, item in value._asdict().items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def _warn(ls: SpecCompleteServer, message: str) -> None:
    ls.window_show_message(
        types.ShowMessageParams(type=types.MessageType.Warning, message=f"spec-complete: {message}")
    )
