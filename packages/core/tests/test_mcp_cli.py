"""`mosaic mcp` without the MCP SDK installed: one line naming the install, exit 2 (runs whether or not the SDK is
here: the import is blocked in the child)."""

import subprocess
import sys


def test_mosaic_mcp_without_the_sdk_says_what_to_install(tmp_path):
    code = ("import sys; sys.modules['mcp'] = None; from mosaic.cli import main; "
            f"main(['mcp', '--campaign', {str(tmp_path)!r}, '--offline'])")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == ["error: the MCP Python SDK is not installed (pip install 'mcp==2.3.0') "
                                             "(mosaic mcp)"]
    assert p.stdout == ""
