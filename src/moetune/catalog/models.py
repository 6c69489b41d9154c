"""Model catalog: one JSON file per model in ``catalog/models/`` (fields of :class:`moetune.spec.ModelArch`).

Lookup is case-insensitive over names and aliases, ignoring spaces, '-', '_' and '.'; any path ending in ``.json``
is read as a Hugging Face ``config.json``, and a folder as a snapshot holding one (see :mod:`moetune.catalog.hf`).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from moetune.catalog.names import normalize_name
from moetune.errors import InputError, UnknownNameError
from moetune.memo import memo
from moetune.spec.model import ModelArch


@memo(maxsize=256)
def _catalog() -> dict[str, ModelArch]:
    out: dict[str, ModelArch] = {}
    root = resources.files("moetune.catalog") / "models"
    for entry in sorted(root.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".json"):
            continue
        data = json.loads(entry.read_text())
        model = ModelArch.model_validate(data)
        out[model.name] = model
    return out


@memo(maxsize=256)
def _index() -> dict[str, str]:
    idx: dict[str, str] = {}
    for name, model in _catalog().items():
        for key in (name, *model.aliases):
            idx[normalize_name(key)] = name
    return idx


def list_models() -> list[ModelArch]:
    """All catalog models, sorted by name."""
    return [m for _, m in sorted(_catalog().items())]


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):  # name too long, NUL byte
        return False


def _looks_like_path(text: str) -> bool:
    return text.lower().endswith(".json") or "/" in text or "\\" in text or _exists(Path(text).expanduser())


def model_from_file(path: Path) -> ModelArch:
    """A model from a JSON file or a Hugging Face snapshot folder holding ``config.json``: a moetune model file
    (``ModelArch`` fields, as in ``catalog/models/``) or a Hugging Face ``config.json`` (one reader for both:
    :func:`moetune.catalog.hf.read_config_json`)."""
    from moetune.catalog.hf import model_from_hf_dict, read_config_json, resolve_config_path
    from moetune.errors import validation_message

    p = resolve_config_path(path)
    data = read_config_json(p)
    if "mixer_pattern" in data or "mlp_pattern" in data:  # moetune's own model format
        try:
            return ModelArch.model_validate(data)
        except ValueError as e:
            raise InputError(validation_message(e, str(p)), field="model") from None
    return model_from_hf_dict(data, p)


def get_model(name_or_path: str) -> ModelArch:
    """A catalog model by name/alias, or a model read from a JSON file (moetune model JSON or Hugging Face
    ``config.json``) or a snapshot folder holding one."""
    key = normalize_name(name_or_path)
    idx = _index()
    path = Path(name_or_path).expanduser()
    if key in idx and not (name_or_path.lower().endswith(".json") or _exists(path)):
        return _catalog()[idx[key]]
    if _looks_like_path(name_or_path):
        if not _exists(path):
            raise InputError(f"{name_or_path}: no such file or folder (expected a catalog model name, a Hugging Face "
                             "config.json, a moetune model JSON or a snapshot folder holding one)", field="model",
                             value=name_or_path, expected="a catalog model, config.json or snapshot folder")
        return model_from_file(path)
    raise UnknownNameError("model", name_or_path, _catalog().keys())
