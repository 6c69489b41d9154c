"""The ``moetune serve`` application (Starlette).

Routes:

- ``GET /`` — the page (``static/index.html``); ``/?model=...&system=...&gpus=...`` fills its form and runs it.
- ``GET /assets/<file>`` — the page's CSS and JS, shipped in the package (no CDN, no network).
- ``GET|POST /api/<command>`` for ``plan``, ``estimate``, ``check``, ``logs``, ``diagnose``, ``trace``, ``catalog/models``,
  ``catalog/systems`` — the command's flags (underscored names, as :mod:`moetune.service` takes them) from the query
  string, a JSON object, form fields or ``multipart/form-data`` (a file field named like the flag that takes the
  path: ``model`` for an HF ``config.json``, ``bridge_config``, ``megatron_args``, ``args`` for check's config file,
  ``files`` for logs, ``paths`` for traces). The answer is the command's ``--json`` object; bad input is a 4xx JSON
  ``{"error": <the CLI's one-line message>, "exit_code": 2}`` (413 over the upload cap) and the server keeps serving.
- ``GET /api/schema`` — every command's argument schema (from :mod:`moetune.service`).
- ``POST /ui/charts`` — the report's SVG charts (:mod:`moetune.report.plots`) for a result the page already holds:
  ``{"result": <plan candidate or estimate JSON>, "candidates": [...], "trace": <trace JSON>}``.

Uploads are streamed into a per-request temp dir (:mod:`moetune.web.uploads`) and deleted after the command ran;
paths inside that dir are reported by their file name only, as the CLI would when run next to the file.
"""

from __future__ import annotations

import threading
from importlib import resources
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from moetune.errors import InputError, MoetuneError, one_line
from moetune.web.uploads import DEFAULT_MAX_UPLOAD_BYTES, PayloadTooLarge, read_input

#: the commands the API serves: URL path -> moetune command (as moetune.service names it)
COMMANDS: dict[str, str] = {
    "plan": "plan", "estimate": "estimate", "check": "check", "logs": "logs", "diagnose": "diagnose",
    "trace": "trace", "catalog/models": "catalog models", "catalog/systems": "catalog systems",
}
#: flags that take several values (repeated form fields / several uploaded files)
LIST_ARGS = frozenset({"files", "paths", "args", "overrides", "env"})
ASSETS = {"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"}


def static_dir() -> Path:
    """The package's ``web/static`` folder (package data, shipped in the wheel)."""
    return Path(str(resources.files("moetune.web") / "static"))


def _strip_tmp(x: Any, prefix: str) -> Any:
    """``x`` with every ``<request temp dir>/<n>/`` prefix removed from its strings (uploads named by file name)."""
    if isinstance(x, str):
        if prefix not in x:
            return x
        import re

        return re.sub(re.escape(prefix) + r"\d+/", "", x)
    if isinstance(x, list):
        return [_strip_tmp(v, prefix) for v in x]
    if isinstance(x, dict):
        return {k: _strip_tmp(v, prefix) for k, v in x.items()}
    return x


def _error(status: int, message: str, exit_code: int = 2) -> JSONResponse:
    return JSONResponse({"error": message, "exit_code": exit_code}, status_code=status)


def _args_for(command: str, fields: dict[str, Any], files: dict[str, list[Path]]) -> dict[str, Any]:
    args: dict[str, Any] = {}
    for k, v in fields.items():
        key = k.replace("-", "_")
        if key in ("json", "json_out", "as_json"):
            continue  # the API always answers JSON
        if isinstance(v, str) and v == "" and key not in LIST_ARGS:
            continue  # an empty form field is an unset flag
        if key in LIST_ARGS and not isinstance(v, list):
            v = [v]
        args[key] = v
    for k, paths in files.items():
        key = k.replace("-", "_")
        vals = [str(p) for p in paths]
        if key in LIST_ARGS:
            prev = args.get(key) or []
            args[key] = vals + [p for p in prev if p]  # the config file first, then overrides
        elif len(vals) == 1:
            args[key] = vals[0]
        else:
            raise InputError.bad_value(k, f"{len(vals)} files", "one file")
    return args


class Server:
    """State of one served application: the upload cap, the temp root and one lock that runs commands one at a
    time (the planner forks its own workers; commands share process-wide caches)."""

    def __init__(self, *, max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES, tmp_root: str | None = None):
        self.max_upload_bytes = max_upload_bytes
        self.tmp_root = tmp_root
        self.lock = threading.Lock()

    def invoke(self, command: str, args: dict[str, Any]) -> dict[str, Any]:
        from moetune import service

        with self.lock:
            return service.run(command, args)

    async def api(self, request: Request) -> Response:
        path = request.path_params["command"].strip("/")
        command = COMMANDS.get(path)
        if command is None:
            return _error(404, f"/api/{path}: unknown endpoint; one of {', '.join('/api/' + c for c in COMMANDS)}")
        inp = None
        try:
            inp = await read_input(request, max_bytes=self.max_upload_bytes, tmp_root=self.tmp_root)
            args = _args_for(command, inp.fields, inp.files)
            out = await run_in_threadpool(self.invoke, command, args)
            if inp.tmpdir is not None:
                out = _strip_tmp(out, str(inp.tmpdir) + "/")
            return JSONResponse(out)
        except PayloadTooLarge as exc:
            return _error(413, one_line(exc))
        except MoetuneError as exc:
            msg = one_line(exc)
            if inp is not None and inp.tmpdir is not None:
                msg = _strip_tmp(msg, str(inp.tmpdir) + "/")
            return _error(400 if getattr(exc, "exit_code", 2) == 2 else 422, msg, getattr(exc, "exit_code", 2))
        finally:
            if inp is not None:
                inp.cleanup()

    async def schema(self, request: Request) -> Response:
        from moetune import service

        return JSONResponse({path: service.schema(cmd) for path, cmd in COMMANDS.items()})

    async def charts(self, request: Request) -> Response:
        try:
            inp = await read_input(request, max_bytes=self.max_upload_bytes, tmp_root=self.tmp_root)
        except MoetuneError as exc:
            return _error(413 if isinstance(exc, PayloadTooLarge) else 400, one_line(exc))
        inp.cleanup()
        from moetune.web.views import charts_for

        try:
            return JSONResponse(charts_for(inp.fields))
        except (TypeError, KeyError, ValueError, AttributeError) as exc:
            return _error(400, f"/ui/charts: not a moetune plan candidate, estimate or trace JSON ({one_line(exc)})")

    async def index(self, request: Request) -> Response:
        return FileResponse(static_dir() / "index.html", media_type="text/html; charset=utf-8",
                            headers={"Cache-Control": "no-store"})

    async def asset(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ASSETS:
            return _error(404, f"/assets/{name}: no such asset")
        return FileResponse(static_dir() / name, media_type=ASSETS[name], headers={"Cache-Control": "no-store"})


def create_app(*, max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES, tmp_root: str | None = None) -> Starlette:
    """The ASGI application ``moetune serve`` runs (tests drive it with Starlette's ``TestClient``)."""
    srv = Server(max_upload_bytes=max_upload_bytes, tmp_root=tmp_root)
    routes = [
        Route("/", srv.index, methods=["GET"]),
        Route("/assets/{name}", srv.asset, methods=["GET"]),
        Route("/api/schema", srv.schema, methods=["GET"]),
        Route("/api/{command:path}", srv.api, methods=["GET", "POST"]),
        Route("/ui/charts", srv.charts, methods=["POST"]),
    ]
    app = Starlette(routes=routes)
    app.state.server = srv
    return app
