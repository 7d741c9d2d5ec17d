"""The spec-complete language server: LSP over stdio or WebSocket, one model worker for every client."""
