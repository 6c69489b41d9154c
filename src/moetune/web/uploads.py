"""Request inputs of the web API: a JSON object, query parameters, or a ``multipart/form-data`` body whose files
are streamed (size-capped) into a private temporary directory that is removed when the request ends.

Nothing a client sends is written anywhere else: the multipart body is parsed here with python-multipart's streaming
parser (Starlette's own form parser spools large parts to the system temp dir), each file lands in
``<request temp dir>/upload-<n>/<sanitised name>`` and the whole directory is deleted after the command ran.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moetune.errors import InputError

#: default cap of one request body (files and fields together), bytes
DEFAULT_MAX_UPLOAD_BYTES = 256 * 1024 * 1024
#: cap of one non-file form field, bytes
MAX_FIELD_BYTES = 64 * 1024


class PayloadTooLarge(InputError):
    """The request body is over the server's upload cap (HTTP 413)."""


def safe_name(name: str) -> str:
    """A client-sent file name reduced to its last path component of ``[A-Za-z0-9._-]`` characters."""
    base = re.split(r"[\\/]", name or "")[-1]
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", base).lstrip(".")
    return base[:120] or "upload"


@dataclass
class RequestInput:
    """Fields (name -> value, or a list for repeated names) and the uploads' temp paths (name -> [paths])."""

    fields: dict[str, Any] = field(default_factory=dict)
    files: dict[str, list[Path]] = field(default_factory=dict)
    tmpdir: Path | None = None

    def ensure_tmpdir(self, tmp_root: str | None = None) -> Path:
        """The request's temp dir (created empty when nothing was uploaded): the command's confining root."""
        if self.tmpdir is None:
            self.tmpdir = Path(tempfile.mkdtemp(prefix="moetune-serve-", dir=tmp_root))
        return self.tmpdir

    def cleanup(self) -> None:
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None


def _add(d: dict[str, Any], key: str, value: Any) -> None:
    if key in d:
        prev = d[key]
        d[key] = [*prev, value] if isinstance(prev, list) else [prev, value]
    else:
        d[key] = value


async def read_input(request, *, max_bytes: int, tmp_root: str | None = None) -> RequestInput:
    """Parse a request's query string and body into a :class:`RequestInput` (the caller must ``cleanup()``)."""
    out = RequestInput()
    for k, v in request.query_params.multi_items():
        _add(out.fields, k, v)
    if request.method in ("GET", "HEAD"):
        return out
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(f"request body: {int(declared)} bytes, over the upload cap of {max_bytes} bytes "
                              "(moetune serve --max-upload-mb)")
    ctype = request.headers.get("content-type", "")
    if ctype.startswith("multipart/form-data"):
        await _read_multipart(request, ctype, out, max_bytes=max_bytes, tmp_root=tmp_root)
        return out
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            raise PayloadTooLarge(f"request body: over the upload cap of {max_bytes} bytes")
    if not body.strip():
        return out
    if ctype.startswith("application/x-www-form-urlencoded"):
        from urllib.parse import parse_qsl

        for k, v in parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True):
            _add(out.fields, k, v)
        return out
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"request body: not valid JSON ({exc}); send a JSON object of the command's flags, "
                         "form fields or multipart/form-data") from None
    if not isinstance(data, dict):
        raise InputError(f"request body: a JSON {type(data).__name__}, expected an object of the command's flags")
    out.fields.update(data)
    return out


async def _read_multipart(request, ctype: str, out: RequestInput, *, max_bytes: int, tmp_root: str | None) -> None:
    from python_multipart.multipart import MultipartParser, parse_options_header

    _, params = parse_options_header(ctype)
    boundary = params.get(b"boundary")
    if not boundary:
        raise InputError("request body: multipart/form-data without a boundary")
    out.ensure_tmpdir(tmp_root)
    state: dict[str, Any] = {"headers": {}, "hname": b"", "hval": b"", "name": None, "fh": None, "buf": None,
                             "n": 0, "field_bytes": 0}

    def on_part_begin() -> None:
        state.update(headers={}, hname=b"", hval=b"", name=None, fh=None, buf=None)

    def on_header_field(data: bytes, start: int, end: int) -> None:
        state["hname"] += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        state["hval"] += data[start:end]

    def on_header_end() -> None:
        state["headers"][state["hname"].lower()] = state["hval"]
        state["hname"], state["hval"] = b"", b""

    def on_headers_finished() -> None:
        _, disp = parse_options_header(state["headers"].get(b"content-disposition", b""))
        name = disp.get(b"name", b"").decode("utf-8", "replace")
        if not name:
            raise InputError("request body: a multipart part without a field name")
        state["name"] = name
        if b"filename" in disp:
            state["n"] += 1
            d = out.tmpdir / f"upload-{state['n']}"  # an HF config.json is named after its folder: "upload-1"
            d.mkdir()
            path = d / safe_name(disp[b"filename"].decode("utf-8", "replace"))
            state["fh"] = path.open("wb")
            out.files.setdefault(name, []).append(path)
        else:
            state["buf"] = bytearray()

    def on_part_data(data: bytes, start: int, end: int) -> None:
        if state["fh"] is not None:
            state["fh"].write(data[start:end])
        else:
            state["buf"] += data[start:end]
            if len(state["buf"]) > MAX_FIELD_BYTES:
                raise InputError(f"form field {state['name']}: over {MAX_FIELD_BYTES} bytes (send files as files)")

    def on_part_end() -> None:
        if state["fh"] is not None:
            state["fh"].close()
            state["fh"] = None
        elif state["buf"] is not None:
            _add(out.fields, state["name"], state["buf"].decode("utf-8", "replace"))

    parser = MultipartParser(boundary, {
        "on_part_begin": on_part_begin, "on_header_field": on_header_field, "on_header_value": on_header_value,
        "on_header_end": on_header_end, "on_headers_finished": on_headers_finished, "on_part_data": on_part_data,
        "on_part_end": on_part_end})
    total = 0
    try:
        async for chunk in request.stream():
            total += len(chunk)
            if total > max_bytes:
                raise PayloadTooLarge(f"request body: over the upload cap of {max_bytes} bytes "
                                      "(moetune serve --max-upload-mb)")
            parser.write(chunk)
        parser.finalize()
    except InputError:
        raise
    except Exception as exc:  # python-multipart's parse errors
        raise InputError(f"request body: malformed multipart/form-data ({exc})") from None
    finally:
        if state["fh"] is not None:
            state["fh"].close()
