"""Embedded Bridge perf-recipe catalog (package data only)."""

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


@pytest.mark.parametrize("system,gpu", [("GB200-NVL72", "gb200"), ("DGX-GB200", "gb200"), ("DGX-B200", "b200"),
                                        ("B200", "b200"), ("GB300-NVL72", "gb300"), ("DGX-B300", "b300"),
                                        ("b300", "b300"), ("gb300", "gb300")])
def test_find_recipe_matches_system_identity_not_substring(system, gpu):
    """'b200' is inside 'gb200': a GB200 system must never get a B200 recipe (and B300 vs GB300 likewise)."""
    models = sorted({r["model"] for r in list_recipes()})
    found = 0
    for model in models:
        # ask with every GPU count any recipe of the model has, so a wrong-system recipe with the closest count wins
        for n in sorted({r["gpus"] for r in list_recipes() if r["model"] == model}):
            r = find_recipe(model, system, gpus=n)
            if r is not None:
                found += 1
                assert r["gpu"] == gpu, (model, system, n, r["name"])
    assert found > 0


def test_calibration_recipe_job_uses_system_identity():
    from moetune.catalog.models import get_model
    from moetune.catalog.systems import get_system
    from moetune.io.load import recipe_job

    for system, gpu in (("GB200-NVL72", "gb200"), ("DGX-B200", "b200")):
        job, notes = recipe_job(get_model("DeepSeek-V3"), get_system(system), 256, "bf16")
        assert job is not None and f"_{gpu}_" in notes[0], notes


def test_unknown_recipe():
    with pytest.raises(UnknownNameError, match="closest"):
        get_recipe("deepseek_v3_pretrain_256gpu_b200_bf17_config")


def test_catalog_parsed_by_orjson_equals_json():
    """``_data`` parses ``recipes.json`` with orjson: the same objects as the standard ``json`` module (values, types,
    key order), compared through ``repr`` so that an int read as a float or a reordered mapping would differ."""
    import json
    from importlib import resources

    from moetune.catalog import recipes

    text = resources.files("moetune.catalog").joinpath("recipes.json").read_text()
    assert repr(recipes._data.__wrapped__()) == repr(json.loads(text))


def _former_find_recipe(model_name, system_name, gpus=None, precision=None, task="pretrain"):
    """``find_recipe`` before its record lookup was memoised apart from the expansion (the oracle)."""
    from moetune.catalog.recipes import _data, _expand, name_key, system_identity

    m, s = name_key(model_name), system_identity(system_name)
    p = name_key(precision) if precision else None
    cands = [r for r in _data()["recipes"]
             if name_key(r["model"]) == m and s in (system_identity(r["system"]), system_identity(r["gpu"]))
             and not (p and p != name_key(r["precision"])) and not (task and r["task"] != task)]
    if not cands:
        return None
    cands.sort(key=lambda r: (r["variant"] is not None, abs((r["gpus"] or 0) - (gpus or r["gpus"] or 0)),
                              r["gpus"] or 0))
    return _expand(cands[0])


def test_find_recipe_and_its_name_equal_the_former_lookup():
    """Every catalog model / system / GPU count / precision / task (and misses): ``find_recipe`` returns what the
    former lookup returned, twice (the memoised record is not changed by the caller's copy), and
    ``find_recipe_name`` its name."""
    from moetune.catalog.recipes import find_recipe, find_recipe_name, list_recipes

    rows = list_recipes()
    models = sorted({r["model"] for r in rows}) + ["No-Such-Model"]
    systems = sorted({r["system"] for r in rows} | {r["gpu"] for r in rows}) + ["DGX-H100", "nowhere"]
    hits = 0
    for model in models:
        for system in systems:
            for gpus in (None, 8, 256):
                for precision in (None, "bf16", "FP8", "mxfp8"):
                    for task in ("pretrain", "sft"):
                        want = _former_find_recipe(model, system, gpus, precision, task)
                        got = find_recipe(model, system, gpus=gpus, precision=precision, task=task)
                        if got is not None:
                            got["config"].clear()  # a caller's change to its copy reaches neither the memo nor _data
                        assert find_recipe(model, system, gpus=gpus, precision=precision, task=task) == want
                        assert find_recipe_name(model, system, gpus, precision, task) == (want and want["name"])
                        hits += want is not None
    assert hits > 50
