"""Read a Megatron-Bridge ``ConfigContainer`` YAML (as written by ``logger.save_config_filepath``) plus overrides.

Bridge serialises dataclasses with OmegaConf/Hydra conventions: every section carries a ``_target_`` (the class
path), dtypes appear as ``{_target_: torch.bfloat16, _call_: false}`` and callables as ``_partial_`` nodes
(``megatron/bridge/utils/yaml_utils.py``). This reader drops class targets, turns non-called targets into their
dotted name (``torch.bfloat16`` -> ``'bfloat16'``), and returns a plain nested dict in ConfigContainer field names
with ``frontend: 'bridge'``. Hydra-style overrides (``a.b=c``) are applied last.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from moetune.errors import InputError
from moetune.io.effective import check_int_fields
from moetune.memo import memo
from moetune.overrides import apply_overrides

#: ConfigContainer sections (megatron/bridge/training/config.py ``ConfigContainer``)
SECTIONS = (
    "model", "train", "optimizer", "ddp", "comm_overlap", "mixed_precision", "dist", "rng", "rerun_state_machine",
    "dataset", "checkpoint", "logger", "scheduler", "tokenizer", "validation", "profiling", "ft", "straggler",
    "nvrx_straggler", "peft", "inprocess_restart", "tensor_inspect", "env_vars", "optimizer_config_override_provider",
)


class _Loader(yaml.SafeLoader):
    """SafeLoader that tolerates python tags OmegaConf sometimes writes (``!!python/name:torch.bfloat16``)."""


def _multi(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return suffix or loader.construct_scalar(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node)
    return loader.construct_mapping(node)


_Loader.add_multi_constructor("tag:yaml.org,2002:python/", _multi)
_Loader.add_multi_constructor("!", _multi)


def _dtype_name(name: str) -> str:
    return name.split(".")[-1] if name.startswith("torch.") else name


def clean_node(node: Any) -> Any:
    """Drop ``_target_`` markers; dtype/callable references become strings."""
    if isinstance(node, dict):
        if "_target_" in node and (node.get("_call_") is False or set(node) <= {"_target_", "_call_", "_partial_"}):
            return _dtype_name(str(node["_target_"]))
        out = {k: clean_node(v) for k, v in node.items() if k not in ("_target_", "_call_", "_partial_", "_args_")}
        if "_target_" in node:
            out["_class"] = str(node["_target_"]).split(".")[-1]  # dataclass name (e.g. GPTSFTDatasetConfig)
        return out
    if isinstance(node, list):
        return [clean_node(v) for v in node]
    if isinstance(node, str) and node.startswith("torch.") and node[6:].replace("_", "").isalnum():
        return node[6:]
    return node


@memo(maxsize=256)
def known_fields() -> dict[str, frozenset[str]]:
    """Field names of each ConfigContainer section: ``catalog/bridge_fields.json`` (the dataclass fields, written by
    ``bench/extract_bridge_fields.py`` from Megatron-Bridge and Megatron-LM sources) plus every field an embedded
    Bridge perf recipe assigns (``recipes.json``: recipes set a few provider attributes that are not dataclass
    fields). Sections absent here (``env_vars``, ``peft``, ...) are free-form."""
    doc = json.loads(resources.files("moetune.catalog").joinpath("bridge_fields.json").read_text())
    out = {sec: set(names) for sec, names in doc["sections"].items() if len(names) > 1}
    recipes = json.loads(resources.files("moetune.catalog").joinpath("recipes.json").read_text())
    for sec, blocks in recipes["blocks"].items():
        if sec in out:
            for block in blocks:
                if isinstance(block, dict):
                    out[sec].update(block)
    return {sec: frozenset(names) for sec, names in out.items()}


def unknown_field(cfg: dict, overrides: dict[str, str] | None = None, name: str = "config") -> None:
    """:class:`InputError` for the first field no ConfigContainer section has (Bridge rejects it too), naming the
    file or the override that set it and the closest known fields. ``overrides`` maps ``section.field`` -> the
    override text; keys starting with ``_`` are moetune's own and pass; ``+``-prefixed overrides (Hydra "add")
    were already left out by the caller."""
    known = known_fields()
    for sec, node in cfg.items():
        if sec not in known or not isinstance(node, dict):
            continue
        for key in node:
            if not isinstance(key, str):
                raise InputError(f"{name}: {sec}.{key!r}: field names must be strings", field=f"{sec}.{key}")
            if key.startswith("_") or key in known[sec]:
                continue
            close = difflib.get_close_matches(key, sorted(known[sec]), n=3, cutoff=0.5)
            hint = f"; closest: {', '.join(f'{sec}.{c}' for c in close)}" if close else ""
            path = f"{sec}.{key}"
            where = f"override {overrides[path]!r}" if overrides and path in overrides else name
            raise InputError(f"{where}: unknown field {path} (not a field of ConfigContainer.{sec}){hint}",
                             field=path, value=key, expected=f"a field of ConfigContainer.{sec}")


def check_override_fields(overrides: Iterable[str], name: str = "override") -> None:
    """Reject overrides of fields that do not exist (``model.no_such_field=1``) with the closest field; Hydra
    ``+key=value`` (explicitly adding a key) and ``~key`` deletions are exempt."""
    from moetune.overrides import parse_override

    probe: dict[str, dict] = {}
    texts: dict[str, str] = {}
    for text in overrides:
        key, _, op = parse_override(text)
        if op != "set" or "." not in key:
            continue
        sec, field = key.split(".", 1)
        if sec not in SECTIONS and sec not in ("frontend", "_meta"):
            close = difflib.get_close_matches(sec, SECTIONS, n=1, cutoff=0.6)
            hint = f"closest: {close[0]}" if close else f"expected one of {', '.join(SECTIONS[:12])}, ..."
            raise InputError(f"override {text!r}: unknown ConfigContainer section {sec!r}; {hint}", field=sec)
        probe.setdefault(sec, {})[field.split(".")[0]] = None
        texts[f"{sec}.{field.split('.')[0]}"] = text
    unknown_field(probe, texts, name)


def load_bridge_dict(text: str, name: str = "config") -> dict:
    try:
        doc = yaml.load(text, Loader=_Loader)  # noqa: S506 - restricted SafeLoader subclass
    except yaml.YAMLError as e:
        raise InputError(f"{name}: not valid YAML ({' '.join(str(e).split())[:160]})") from None
    if not isinstance(doc, dict):
        raise InputError(f"{name}: expected a ConfigContainer mapping (model:, train:, ...), got {type(doc).__name__}")
    cfg = clean_node(doc)
    unknown = [k for k in cfg if k not in SECTIONS and k not in ("frontend", "_meta")]
    if "model" not in cfg:
        raise InputError(f"{name}: no 'model' section; expected a Megatron-Bridge ConfigContainer YAML")
    if not isinstance(cfg["model"], dict):
        raise InputError.bad_value(f"{name}: model", cfg["model"], "a mapping of model fields")
    for k in unknown:
        close = difflib.get_close_matches(str(k), SECTIONS, n=1, cutoff=0.6)
        hint = f"closest: {close[0]}" if close else f"expected one of {', '.join(SECTIONS[:12])}, ..."
        raise InputError(f"{name}: unknown ConfigContainer section {k!r}; {hint}", field=str(k))
    unknown_field(cfg, None, name)
    try:
        check_int_fields(cfg)
    except InputError as e:
        raise InputError(f"{name}: {e}", field=e.field, value=e.value, expected=e.expected) from None
    cfg["frontend"] = "bridge"
    return cfg


def read_bridge_config(path: str | Path | None, overrides: Iterable[str] | None = None, *,
                       base: dict | None = None) -> dict:
    """ConfigContainer YAML at ``path`` (or ``base`` dict) with Hydra-style ``overrides`` -> nested dict."""
    if path is not None:
        from moetune.files import read_text

        text = read_text(path, "a Megatron-Bridge ConfigContainer YAML")
        cfg = load_bridge_dict(text, str(path))
    elif base is not None:
        cfg = dict(base)
        cfg.setdefault("frontend", "bridge")
    else:
        cfg = {"frontend": "bridge", "model": {}}
    if overrides:
        check_override_fields(list(overrides))
        cfg = apply_overrides(cfg, list(overrides))
        for k in cfg:
            if k not in SECTIONS and k not in ("frontend", "_meta"):
                raise InputError(f"override section {k!r} unknown; expected one of {', '.join(SECTIONS[:12])}, ...")
    check_int_fields(cfg)
    return cfg
