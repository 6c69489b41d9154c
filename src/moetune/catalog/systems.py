"""System catalog: one JSON file per system in ``catalog/systems/`` (fields of :class:`moetune.spec.System`,
every number with its source in ``sources``). Custom systems load from a YAML/JSON file path."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from pydantic import ValidationError

from moetune.catalog.names import normalize_name
from moetune.errors import InputError, UnknownNameError
from moetune.memo import memo
from moetune.spec.system import System


@memo(maxsize=256)
def _catalog() -> dict[str, System]:
    out: dict[str, System] = {}
    root = resources.files("moetune.catalog") / "systems"
    for entry in sorted(root.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            s = System.model_validate(json.loads(entry.read_text()))
            out[s.name] = s
    return out


@memo(maxsize=256)
def _index() -> dict[str, str]:
    idx: dict[str, str] = {}
    for name, s in _catalog().items():
        for key in (name, *s.aliases):
            idx[normalize_name(key)] = name
    return idx


def list_systems() -> list[System]:
    return [s for _, s in sorted(_catalog().items())]


def load_system_file(path: Path) -> System:
    """A custom system from YAML or JSON (same fields as the catalog files)."""
    import yaml

    from moetune.files import read_text

    text = read_text(path, "a system YAML/JSON (fields of catalog/systems/*.json)")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: not valid YAML/JSON ({exc.__class__.__name__})", field="system") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a mapping of System fields", field="system")
    try:
        return System.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise InputError(f"{path}: field {loc!r}: {err['msg']}", field=loc) from None


def get_system(name_or_path: str) -> System:
    """A catalog system by name/alias ('DGX-H100', 'H100', 'GB200-NVL72', 'DGX-GB200'), or a YAML/JSON file."""
    if name_or_path.lower().endswith((".yaml", ".yml", ".json")):
        path = Path(name_or_path)
        if not path.is_file():
            raise InputError(f"{name_or_path}: no such system file", field="system")
        return load_system_file(path)
    key = normalize_name(name_or_path)
    if key not in _index():
        raise UnknownNameError("system", name_or_path, _catalog().keys())
    return _catalog()[_index()[key]]
