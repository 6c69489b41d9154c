"""Read a Megatron-Bridge ``ConfigContainer`` YAML (as written by ``logger.save_config_filepath``) plus overrides.

Bridge serialises dataclasses with OmegaConf/Hydra conventions: every section carries a ``_target_`` (the class
path), dtypes appear as ``{_target_: torch.bfloat16, _call_: false}`` and callables as ``_partial_`` nodes
(``megatron/bridge/utils/yaml_utils.py``). This reader drops class targets, turns non-called targets into their
dotted name (``torch.bfloat16`` -> ``'bfloat16'``), and returns a plain nested dict in ConfigContainer field names
with ``frontend: 'bridge'``. Hydra-style overrides (``a.b=c``) are applied last.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from moetune.errors import InputError
from moetune.io.overrides import apply_overrides
from moetune.rules.effective import check_int_fields

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
        raise InputError(f"{name}: unknown ConfigContainer section {k!r}; expected one of {', '.join(SECTIONS[:12])}, ...")
    cfg["frontend"] = "bridge"
    return cfg


def read_bridge_config(path: str | Path | None, overrides: Iterable[str] | None = None, *,
                       base: dict | None = None) -> dict:
    """ConfigContainer YAML at ``path`` (or ``base`` dict) with Hydra-style ``overrides`` -> nested dict."""
    if path is not None:
        p = Path(path)
        try:
            text = p.read_text()
        except FileNotFoundError:
            raise InputError(f"{path}: no such file") from None
        except OSError as e:
            raise InputError(f"{path}: cannot read ({e.strerror})") from None
        cfg = load_bridge_dict(text, str(path))
    elif base is not None:
        cfg = dict(base)
        cfg.setdefault("frontend", "bridge")
    else:
        cfg = {"frontend": "bridge", "model": {}}
    if overrides:
        cfg = apply_overrides(cfg, list(overrides))
        for k in cfg:
            if k not in SECTIONS and k not in ("frontend", "_meta"):
                raise InputError(f"override section {k!r} unknown; expected one of {', '.join(SECTIONS[:12])}, ...")
    check_int_fields(cfg)
    return cfg
