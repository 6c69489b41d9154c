"""``moetune serve``: the local web page and JSON API (:mod:`moetune.web`; extra ``moetune[web]``)."""

from typing import Annotated

import typer

from moetune.errors import InputError
from moetune.output import err_console

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def register(app: typer.Typer) -> None:
    @app.command("serve")
    def serve_cmd(
        host: Annotated[str, typer.Option(help="Interface to bind (localhost by default; anything else exposes the "
                                               "planner to the network).")] = "127.0.0.1",
        port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
        max_upload_mb: Annotated[float, typer.Option("--max-upload-mb", help="Cap of one request's uploads (MiB).")]
        = 256.0,
    ) -> None:
        """Serve the planner page at http://HOST:PORT/ and the JSON API at /api/<command> (offline, no CDN)."""
        if not 0 < port < 65536:
            raise InputError.bad_value("--port", port, "a TCP port 1-65535")
        if not max_upload_mb > 0:
            raise InputError.bad_value("--max-upload-mb", max_upload_mb, "a positive size in MiB")
        try:
            import uvicorn

            from moetune.web.app import create_app
        except ModuleNotFoundError as exc:
            raise InputError(f"moetune serve needs {exc.name}: pip install 'moetune[web]'") from None
        if host not in LOOPBACK:
            err_console.print(f"[yellow]note:[/] binding {host}: the page and API are reachable from the network "
                              "(no authentication)", markup=True)
        err_console.print(f"moetune serve: http://{'[' + host + ']' if ':' in host else host}:{port}/ "
                          "(Ctrl-C stops)", markup=False)
        uvicorn.run(create_app(max_upload_bytes=int(max_upload_mb * 1024 * 1024)), host=host, port=port,
                    log_level="warning")
