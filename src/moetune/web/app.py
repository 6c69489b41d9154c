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
- ``POST /ui/reproduce`` — a printed ``moetune <command> ...`` line (a plan candidate's ``reproduce``) as that
  endpoint's arguments (:func:`moetune.service.args_from_argv`).
- ``POST /ui/charts`` — the report's SVG charts (:mod:`moetune.report.plots`) for a result the page already holds:
  ``{"result": <plan candidate or estimate JSON>, "candidates": [...], "trace": <trace JSON>}``.

Uploads are streamed into a per-request temp dir (:mod:`moetune.web.uploads`) and deleted after the command ran;
paths inside that dir are reported by their file name only, as the CLI would when run next to the file.
"""

from __future__ import annotations

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
ASSETS = {"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"}


def static_dir() -> Path:
    """The package's ``web/static`` folder (package data, shipped in the wheel)."""
    return Path(str(resources.files("moetune.web") / "static"))


def _strip_tmp(x: Any, prefix: str) -> Any:
    """``x`` with every ``<request temp dir>/upload-<n>/`` prefix removed from its strings (uploads named by file name)."""
    if isinstance(x, str):
        if prefix not in x:
            return x
        import re

        return re.sub(re.escape(prefix) + r"upload-\d+/", "", x)
    if isinstance(x, list):
        return [_strip_tmp(v, prefix) for v in x]
    if isinstance(x, dict):
        return {k: _strip_tmp(v, prefix) for k, v in x.items()}
    return x


def _error(status: int, message: str, exit_code: int = 2) -> JSONResponse:
    return JSONResponse({"error": message, "exit_code": exit_code}, status_code=status)


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def _convert(value: Any, arg: Any) -> Any:
    """A query-string / form value (text) as the JSON type the command's argument takes (JSON bodies pass as is)."""
    if not isinstance(value, str):
        return value
    label = arg.flag or arg.name
    t = value.strip()
    if arg.json_type == "integer":
        try:
            return int(t)
        except ValueError:
            raise InputError.bad_value(label, value, "an integer") from None
    if arg.json_type == "number":
        try:
            return float(t)
        except ValueError:
            raise InputError.bad_value(label, value, "a number") from None
    if arg.json_type == "boolean":
        if t.lower() in _TRUE:
            return True
        if t.lower() in _FALSE:
            return False
        raise InputError.bad_value(label, value, "true or false")
    return value


def command_args(command: str, fields: dict[str, Any], files: dict[str, list[Path]]) -> dict[str, Any]:
    """The :func:`moetune.service.run` arguments of one request: fields converted to the argument's JSON type
    (from the command's own schema), uploads as their temp paths (a list where the argument takes several; the
    uploaded config file before any text overrides). Unknown names pass through: the service names them."""
    from moetune import service

    spec = service.get_command(command).args
    args: dict[str, Any] = {}
    for k, v in fields.items():
        key = k.replace("-", "_")
        if key == "json":
            continue  # the API always answers JSON
        arg = spec.get(key)
        if arg is None:
            args[key] = v
            continue
        vals = v if isinstance(v, list) else [v]
        if not arg.is_flag or arg.json_type != "boolean":
            vals = [x for x in vals if not (isinstance(x, str) and x == "")]  # an empty form field: flag unset
        if not vals:
            continue
        vals = [_convert(x, arg) for x in vals]
        args[key] = vals if arg.many else (vals[0] if len(vals) == 1 else vals)
    for k, paths in files.items():
        key = k.replace("-", "_")
        arg = spec.get(key)
        vals = [str(p) for p in paths]
        if arg is not None and arg.many:
            prev = args.get(key) or []
            args[key] = vals + (prev if isinstance(prev, list) else [prev])
        elif len(vals) == 1:
            args[key] = vals[0]
        else:
            raise InputError.bad_value(k, f"{len(vals)} files", "one file")
    return args


def parse_command_line(line: str) -> dict[str, Any]:
    """``moetune <command> ARGS`` (POSIX quoting) -> ``{"command": <API path>, "args": {...}}`` for a command the
    API serves (:func:`moetune.service.args_from_argv`)."""
    import shlex

    from moetune import service

    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise InputError(f"line={line!r}: not a shell command line ({exc})") from None
    if words and words[0] in ("moetune", "python -m moetune"):
        words = words[1:]
    for path, name in sorted(COMMANDS.items(), key=lambda kv: -len(kv[1].split())):
        n = len(name.split())
        if words[:n] == name.split():
            return {"command": path, "args": service.args_from_argv(name, words[n:])}
    raise InputError(f"line={line[:80]!r}: expected `moetune <command> ...` with one of "
                     f"{', '.join(sorted(set(COMMANDS.values())))}")


class Server:
    """State of one served application: the upload cap and the temp root (the service runs one call at a time)."""

    def __init__(self, *, max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES, tmp_root: str | None = None):
        self.max_upload_bytes = max_upload_bytes
        self.tmp_root = tmp_root

    @staticmethod
    def invoke(command: str, args: dict[str, Any], root: Path) -> Any:
        """One command through :func:`moetune.service.run`, confined to the request's temp dir (a client can
        name only what it uploaded, never a file of the server)."""
        from moetune import service

        return service.run(command, args, root=root)

    async def api(self, request: Request) -> Response:
        path = request.path_params["command"].strip("/")
        command = COMMANDS.get(path)
        if command is None:
            return _error(404, f"/api/{path}: unknown endpoint; one of {', '.join('/api/' + c for c in COMMANDS)}")
        inp = None
        try:
            inp = await read_input(request, max_bytes=self.max_upload_bytes, tmp_root=self.tmp_root)
            args = command_args(command, inp.fields, inp.files)
            root = inp.ensure_tmpdir(self.tmp_root)
            out = await run_in_threadpool(self.invoke, command, args, root)
            return JSONResponse(_strip_tmp(out, str(root) + "/"))
        except PayloadTooLarge as exc:
            return _error(413, one_line(exc))
        except MoetuneError as exc:
            msg = one_line(exc)
            if inp is not None and inp.tmpdir is not None:
                msg = _strip_tmp(msg, str(inp.tmpdir) + "/").replace(str(inp.tmpdir), "<uploads>")
            code = getattr(exc, "exit_code", 2)
            return _error(400 if code == 2 else 422, msg, code)
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

    async def reproduce(self, request: Request) -> Response:
        """``{"line": "moetune estimate ..."}`` -> ``{"command", "args"}``: a printed command line (a plan
        candidate's ``reproduce``) as the arguments its ``/api/<command>`` takes."""
        try:
            inp = await read_input(request, max_bytes=self.max_upload_bytes, tmp_root=self.tmp_root)
            inp.cleanup()
            return JSONResponse(parse_command_line(str(inp.fields.get("line") or "")))
        except MoetuneError as exc:
            return _error(413 if isinstance(exc, PayloadTooLarge) else 400, one_line(exc))

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
        Route("/ui/reproduce", srv.reproduce, methods=["POST"]),
    ]
    app = Starlette(routes=routes)
    app.state.server = srv
    return app
