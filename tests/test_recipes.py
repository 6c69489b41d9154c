"""Embedded Bridge perf-recipe catalog (package data, no ../shared needed)."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from moetune.catalog.recipes import find_recipe, get_recipe, list_recipes, recipe_config
from moetune.errors import UnknownNameError


def test_catalog_size_and_fields():
    rows = list_recipes()
    assert len(rows) == 300
    assert {"name", "model", "task", "gpus", "system", "gpu", "precision", "variant"} <= set(rows[0])
    raw = resources.files("moetune.catalog").joinpath("recipes.json").read_bytes()
    assert len(raw) < 500_000
    assert json.loads(raw)["source"]["commit"]


def test_get_recipe_and_config():
    r = get_recipe("deepseek_v3_pretrain_256gpu_b200_bf16_config")
    assert r["gpus"] == 256 and r["system"] == "DGX-B200"
    cfg = recipe_config("deepseek_v3_pretrain_256gpu_b200_bf16_config")
    m = cfg["model"]
    assert m["pipeline_model_parallel_size"] == 16 and m["expert_model_parallel_size"] == 8
    assert m["moe_token_dispatcher_type"] == "flex" and m["moe_flex_dispatcher_backend"] == "hybridep"
    assert m["num_layers"] == 61 and m["num_moe_experts"] == 256  # provider architecture merged in
    assert cfg["env_vars"]["NVLINK_DOMAIN_SIZE"] == "8" and cfg["mixed_precision"]["bf16"] is True
    assert get_recipe("deepseek_v3_pretrain_256gpu_b200_bf16")["name"].endswith("_config")


def test_find_recipe():
    r = find_recipe("Qwen3-30B-A3B", "DGX-H100", gpus=16, precision="BF16")
    assert r is not None and r["model"] == "Qwen3-30B-A3B" and r["gpu"] == "h100"
    assert find_recipe("Qwen3-30B-A3B", "nonexistent-system") is None


def test_unknown_recipe():
    with pytest.raises(UnknownNameError, match="closest"):
        get_recipe("deepseek_v3_pretrain_256gpu_b200_bf17_config")
