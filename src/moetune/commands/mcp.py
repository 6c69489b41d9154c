"""``moetune mcp``: serve moetune's commands, catalogs and workflows to coding agents over MCP (stdio)."""

from pathlib import Path
from typing import Annotated

import typer

from moetune.errors import InputError


def register(app: typer.Typer) -> None:
    @app.command("mcp")
    def mcp_cmd(
        root: Annotated[Path, typer.Option("--root", help="The only folder the server may read or write "
                                                          "(default: the working directory).")] = Path("."),
        allow_submit: Annotated[bool, typer.Option("--allow-submit", help="Offer sweep_submit / sweep_status "
                                                                          "(sbatch, squeue); off by default.")]
        = False,
        timeout: Annotated[float, typer.Option("--timeout", help="Time limit per tool call (s).")] = 300.0,
        max_output_mb: Annotated[float, typer.Option("--max-output-mb", help="Largest tool result (MiB).")] = 8.0,
    ) -> None:
        """Run the MCP server on stdio (tools = the moetune commands; resources = catalogs; prompts = workflows)."""
        try:
            import anyio

            from moetune.mcp.server import MoetuneMCP
        except ImportError as e:
            raise InputError(f"moetune mcp needs the MCP SDK ({e.name} is missing): pip install 'moetune[mcp]'") \
                from None
        if timeout <= 0:
            raise InputError.bad_value("--timeout", timeout, "a positive number of seconds")
        if max_output_mb <= 0:
            raise InputError.bad_value("--max-output-mb", max_output_mb, "a positive size in MiB")
        if not root.is_dir():
            raise InputError.bad_value("--root", str(root), "an existing folder")
        srv = MoetuneMCP(root, allow_submit=allow_submit, timeout_s=timeout,
                         max_output_bytes=int(max_output_mb * 1024 * 1024))
        anyio.run(srv.serve_stdio)
