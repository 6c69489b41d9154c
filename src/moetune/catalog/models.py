"""Model catalog: one JSON file per model in ``catalog/models/`` (fields of :class:`moetune.spec.ModelArch`).

Lookup is case-insensitive over names and aliases, ignoring spaces, '-', '_' and '.'; any path ending in ``.json``
is read as a Hugging Face ``config.json``, and a folder as a snapshot holding one (see :mod:`moetune.io.hf`).
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources
from pathlib import Path

from moetune.errors import InputError, UnknownNameError
from moetune.spec.model import ModelArch


def normalize_name(name: str) -> str:
    """Key for case- and punctuation-insensitive lookup: 'GPT OSS 120B' == 'gpt-oss-120b' == 'GPT_OSS_120B'."""
    return re.sub(r"[\s\-_.()/]+", "", name.lower())


@cache
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


@cache
def _index() -> dict[str, str]:
    idx: dict[str, str] = {}
    for name, model in _catalog().items():
        for key in (name, *model.aliases):
            idx[normalize_name(key)] = name
    return idx


def list_models() -> list[ModelArch]:
    """All catalog models, sorted by name."""
    return [m for _, m in sorted(_catalog().items())]


def get_model(name_or_path: str) -> ModelArch:
    """A catalog model by name/alias, or a model read from a Hugging Face ``config.json`` path or a snapshot folder
    holding one."""
    from moetune.io.hf import model_from_hf_config  # local import: io depends on catalog, not vice versa

    path = Path(name_or_path).expanduser()
    if name_or_path.lower().endswith(".json") or path.is_dir():
        if not path.exists():
            raise InputError(f"{name_or_path}: no such file (expected a Hugging Face config.json)", field="model",
                             value=name_or_path, expected="an existing config.json")
        return model_from_hf_config(path)
    key = normalize_name(name_or_path)
    idx = _index()
    if key not in idx:
        if "/" in name_or_path or "\\" in name_or_path:
            raise InputError(f"{name_or_path}: no such file or folder (expected a catalog model name, a Hugging Face "
                             "config.json or a snapshot folder holding one)", field="model", value=name_or_path,
                             expected="a catalog model, config.json or snapshot folder")
        raise UnknownNameError("model", name_or_path, _catalog().keys())
    return _catalog()[idx[key]]
