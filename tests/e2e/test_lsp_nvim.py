"""A real editor: headless Neovim's built-in LSP client attaches to the server over stdio and completes.

Skips (and says why) when nvim is not installed: `apt-get install -y neovim`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

NVIM = shutil.which("nvim")
SERVER = [sys.executable, "-m", "lsp_server", "--stdio", "--target", "tiny-random", "--threads", "1"]
SOURCE = "def add(a, b):\n    return a + b\n"

# Works with Neovim 0.7 (Debian 12) and later: start_client + buf_attach_client, no vim.lsp.start.
SCRIPT = r"""
local cmd = vim.fn.json_decode(os.getenv("SPEC_CMD"))
local ready = false
vim.cmd("edit " .. vim.fn.fnameescape(os.getenv("SPEC_FILE")))
local bufnr = vim.api.nvim_get_current_buf()
local id = vim.lsp.start_client({
  name = "spec-complete",
  cmd = cmd,
  root_dir = vim.fn.getcwd(),
  init_options = { syntax = false, maxNewTokens = 8 },
  on_init = function() ready = true end,
})
vim.lsp.buf_attach_client(bufnr, id)
local report = { attached = vim.wait(150000, function() return ready end, 50) }
if report.attached then
  vim.api.nvim_win_set_cursor(0, { 2, 12 })  -- line 2 (1-based), after "    return a"
  local params = vim.lsp.util.make_position_params()
  report.completion = vim.lsp.buf_request_sync(bufnr, "textDocument/completion", params, 60000)
  local client = vim.lsp.get_client_by_id(id)
  local inline_params = { textDocument = params.textDocument, position = params.position,
                          context = { triggerKind = 1 } }
  report.inline = client.request_sync("textDocument/inlineCompletion", inline_params, 60000, bufnr)
  vim.lsp.stop_client(id)
  report.stopped = vim.wait(20000, function() return vim.lsp.get_client_by_id(id) == nil end, 50)
end
vim.fn.writefile({ vim.fn.json_encode(report) }, os.getenv("SPEC_OUT"))
vim.cmd("qa!")
"""


def test_neovim_receives_a_completion_over_stdio(tmp_path):
    if NVIM is None:
        print("skipping: nvim is not installed (apt-get install -y neovim)", file=sys.stderr)
        pytest.skip("nvim is not installed (apt-get install -y neovim)")
    source, script, out = tmp_path / "sample.py", tmp_path / "complete.lua", tmp_path / "report.json"
    source.write_text(SOURCE)
    script.write_text(SCRIPT)
    env = {**os.environ, "SPEC_CMD": json.dumps(SERVER), "SPEC_FILE": str(source), "SPEC_OUT": str(out)}
    process = subprocess.Popen(
        [NVIM, "--headless", "--clean", "-n", "-S", str(script)],
        env=env,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its language server child dies with the group below
    )
    try:
        _, stderr = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, 9)
            process.wait()
    assert out.exists(), f"nvim wrote no report; stderr: {stderr.decode()[-2000:]}"
    report = json.loads(out.read_text())
    assert report["attached"], "the server did not initialize"
    by_client = report["completion"]  # {client id: response}; Lua's {[1] = x} encodes as a list
    (response,) = [r for r in (by_client.values() if isinstance(by_client, dict) else by_client) if r]
    items = response["result"]["items"]
    assert len(items) == 1 and items[0]["textEdit"]["newText"].startswith("a")
    assert report["inline"]["result"]["items"][0]["insertText"] == items[0]["textEdit"]["newText"][1:]
    assert report["stopped"], "the server should shut down when nvim stops its client"
