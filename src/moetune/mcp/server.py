"""The moetune MCP server (official MCP Python SDK, low-level ``Server``).

Tools run the ``moetune`` commands through :mod:`moetune.service` (same arguments, same ``--json`` result, same
one-line errors), in a worker thread so the server keeps answering while a long search runs and can report its
progress. Safety: every path argument must resolve inside ``root`` (symlinks included); no shell; nothing reaches
Slurm unless the server was started with ``allow_submit``; outputs are bounded and calls time-limited; a bad call
becomes a tool error (``isError``) and the server keeps serving.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
import mcp_types as types
import orjson
from mcp.server import Server
from mcp.shared.exceptions import MCPError

from moetune import __version__, service
from moetune.errors import one_line
from moetune.mcp.prompts import PROMPTS
from moetune.mcp.resources import RESOURCES
from moetune.mcp.tools import SAVE_ARG, ToolSpec, available_tools

#: default per-call time limit (s)
DEFAULT_TIMEOUT_S = 300.0

#: progress notifications are sent at most this often (s)
PROGRESS_INTERVAL_S = 0.1

INSTRUCTIONS = (
    "moetune plans, estimates, checks and diagnoses Mixture-of-Experts training on Megatron-Core / Megatron-Bridge. "
    "Start with `plan` (which layout and features fit and run fastest), confirm with `estimate` and `check`, size "
    "layouts with `layout`, read runs with `logs` / `diagnose` / `compare` / `trace`, and turn a plan into a Slurm "
    "sweep with `sweep_init`. Arguments are the CLI flags with underscores; results are the commands' --json "
    "objects. Paths are relative to the server's root folder. The prompts are guided workflows."
)


def _error(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True)


class MoetuneMCP:
    """State of one server: the root folder, the policy and the tools on offer."""

    def __init__(self, root: str | Path = ".", *, allow_submit: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S,
                 max_output_bytes: int = service.MAX_OUTPUT_BYTES):
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise service.CommandError(f"--root {root}: expected an existing folder", 2)
        self.allow_submit = allow_submit
        self.timeout_s = timeout_s
        self.max_output_bytes = max_output_bytes
        self.tools: dict[str, ToolSpec] = {t.name: t for t in available_tools(allow_submit=allow_submit)}
        self.server: Server[Any] = Server(
            "moetune", version=__version__, title="moetune", instructions=INSTRUCTIONS,
            description="Plan, estimate, check and diagnose MoE training on Megatron-Core / Megatron-Bridge",
            on_list_tools=self._list_tools, on_call_tool=self._call_tool,
            on_list_resources=self._list_resources, on_read_resource=self._read_resource,
            on_list_prompts=self._list_prompts, on_get_prompt=self._get_prompt,
        )

    # ---------------------------------------------------------------------------------------------------- tools
    def tool_list(self) -> list[types.Tool]:
        out = []
        for t in self.tools.values():
            out.append(types.Tool(
                name=t.name, title=f"moetune {' / '.join(t.commands)}", description=t.description(),
                input_schema=t.input_schema(), output_schema={"type": "object"},
                annotations=types.ToolAnnotations(read_only_hint=not (t.writes or t.needs_submit),
                                                  destructive_hint=False, idempotent_hint=not t.needs_submit,
                                                  open_world_hint=t.needs_submit),
            ))
        return out

    async def _list_tools(self, ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self.tool_list())

    async def _call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        spec = self.tools.get(params.name)
        if spec is None:
            hidden = " (needs `moetune mcp --allow-submit`)" if params.name in ("sweep_submit", "sweep_status") else ""
            err = service.unknown_name("tool", params.name, list(self.tools))
            return _error(f"{err}{hidden}")
        args = dict(params.arguments or {})
        try:
            save = args.pop(SAVE_ARG, None)
            if save is not None:
                if not isinstance(save, str) or not save.strip():
                    raise service.CommandError(f"{SAVE_ARG}={save!r}: expected a file path inside the root", 2)
                service.confine(save, self.root, what=SAVE_ARG)
            command, cargs = spec.command_for(args)
            data = await self._run(ctx, command, cargs, long=spec.long)
            if save is not None:
                target = self.root / save
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n")
        except service.CommandError as e:
            return _error(str(e))
        except TimeoutError:
            return _error(f"`{params.name}` stopped: it ran past the server's time limit of {self.timeout_s:g} s")
        except Exception as e:  # a bug in a command: report it as a tool error and keep serving
            return _error(f"internal error in `{params.name}`: {type(e).__name__}: {one_line(e)}")
        structured = data if isinstance(data, dict) else {"items": data}
        text = orjson.dumps(data).decode()
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                    structured_content=structured)

    async def _run(self, ctx: Any, command: str, args: dict[str, Any], *, long: bool) -> Any:
        """service.run in a worker thread; progress forwarded as MCP progress notifications (the one hook)."""
        last = [0.0]

        def progress(done: float, total: float | None, message: str | None) -> None:
            now = time.monotonic()
            if total is None or done < total:
                if now - last[0] < PROGRESS_INTERVAL_S:
                    return
            last[0] = now
            session = getattr(ctx, "session", None)
            if session is None:
                return
            try:
                anyio.from_thread.run(session.report_progress, float(done), None if total is None else float(total),
                                      message)
            except Exception:  # a client that went away must not stop the computation
                pass

        call = functools.partial(service.run, command, args, root=self.root, progress=progress if long else None,
                                 timeout_s=self.timeout_s, max_output_bytes=self.max_output_bytes)
        with anyio.fail_after(self.timeout_s + 10):
            return await anyio.to_thread.run_sync(call, abandon_on_cancel=True)

    # ------------------------------------------------------------------------------------------------ resources
    async def _list_resources(self, ctx: Any, params: Any) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[
            types.Resource(uri=r.uri, name=r.name, description=r.description, mime_type="application/json")
            for r in RESOURCES])

    async def _read_resource(self, ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        uri = str(params.uri)
        spec = next((r for r in RESOURCES if r.uri == uri), None)
        if spec is None:
            raise MCPError(types.INVALID_PARAMS, f"unknown resource {uri!r}; known: "
                           f"{', '.join(r.uri for r in RESOURCES)}")
        data = await anyio.to_thread.run_sync(spec.read)
        return types.ReadResourceResult(contents=[types.TextResourceContents(
            uri=uri, mime_type="application/json", text=orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())])

    # -------------------------------------------------------------------------------------------------- prompts
    async def _list_prompts(self, ctx: Any, params: Any) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=[
            types.Prompt(name=p.name, title=p.title, description=p.description, arguments=[
                types.PromptArgument(name=a.name, description=a.description + (f" (default {a.default})"
                                                                                if a.default else ""),
                                     required=a.required) for a in p.args]) for p in PROMPTS])

    async def _get_prompt(self, ctx: Any, params: types.GetPromptRequestParams) -> types.GetPromptResult:
        spec = next((p for p in PROMPTS if p.name == params.name), None)
        if spec is None:
            raise MCPError(types.INVALID_PARAMS, f"unknown prompt {params.name!r}; known: "
                           f"{', '.join(p.name for p in PROMPTS)}")
        try:
            text = spec.render(dict(params.arguments or {}))
        except ValueError as e:
            raise MCPError(types.INVALID_PARAMS, str(e)) from None
        return types.GetPromptResult(description=spec.description, messages=[
            types.PromptMessage(role="user", content=types.TextContent(type="text", text=text))])

    # ---------------------------------------------------------------------------------------------------- serve
    async def serve_stdio(self) -> None:
        from mcp.server.stdio import stdio_server

        async with stdio_server() as (read_stream, write_stream):
            await self.server.run(read_stream, write_stream, self.server.create_initialization_options())


def build_server(root: str | Path = ".", **kw: Any) -> Server[Any]:
    """The SDK ``Server`` (for in-process clients: ``mcp.Client(build_server(root))``)."""
    return MoetuneMCP(root, **kw).server
