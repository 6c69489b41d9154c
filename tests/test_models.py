"""Model catalog: every issue model present, perf-table spellings resolve, lookups are case-insensitive."""

from __future__ import annotations

import csv

import pytest

from moetune.catalog.models import get_model, list_models, normalize_name
from moetune.errors import UnknownNameError

REQUIRED = ["DeepSeek-V3", "DeepSeek-V3 (w/o MTP)", "DeepSeek-V2", "DeepSeek-V2-Lite", "Moonlight-16B-A3B", "Kimi-K2",
            "Qwen3-30B-A3B", "Qwen3-235B-A22B", "Qwen3-Next-80B-A3B", "Qwen2-57B-A14B", "Mixtral-8x7B",
            "Mixtral-8x22B", "GPT-OSS-20B", "GPT-OSS-120B", "Llama-4-Scout", "Llama-4-Maverick", "GLM-4.5",
            "GLM-4.5-Air", "OLMoE-1B-7B", "Nemotron-3-Nano", "Nemotron-3.5-Lightning", "Llama-3-8B", "Llama-3-70B",
            "Llama-3.1-405B", "Nemotron-3-Super"]


def test_all_required_models_present():
    names = {m.name for m in list_models()}
    assert set(REQUIRED) <= names


@pytest.mark.parametrize("alias,name", [
    ("DeepSeekV3", "DeepSeek-V3"), ("DeepSeekV3 (w/o MTP)", "DeepSeek-V3 (w/o MTP)"),
    ("DeepSeekV3 (tokendrop)", "DeepSeek-V3"), ("DeepSeekV3 (dropless)", "DeepSeek-V3"),
    ("DeepSeekV3 (w/ MTP)", "DeepSeek-V3"), ("Qwen3_30B_a3B", "Qwen3-30B-A3B"),
    ("Qwen3_30B_a3B (tokendrop)", "Qwen3-30B-A3B"), ("GPT OSS 120B", "GPT-OSS-120B"),
    ("LLAMA3.1_405B", "Llama-3.1-405B"), ("LLAMA3_70B", "Llama-3-70B"), ("LLAMA3_8B", "Llama-3-8B"),
    ("Nemotron_3_Nano", "Nemotron-3-Nano"), ("Nemotron_3_Super", "Nemotron-3-Super"),
    ("Nemotron_3_5_Lightning", "Nemotron-3.5-Lightning"), ("deepseek-v3", "DeepSeek-V3"), ("gpt-oss-20b", "GPT-OSS-20B"),
])
def test_perf_table_spellings(alias, name):
    assert get_model(alias).name == name


def test_aliases_unique():
    seen: dict[str, str] = {}
    for m in list_models():
        for key in (m.name, *m.aliases):
            k = normalize_name(key)
            assert seen.setdefault(k, m.name) == m.name, (key, seen[k], m.name)


def test_perf_table_models_resolve(shared_data):
    """Every model of the calibration table resolves, except those whose architecture is not public in our sources."""
    unknown_arch = {"DeepSeekV4 Flash", "Nemotron_3_Ultra"}
    with open(shared_data / "perf" / "mbridge_perf_calibration.csv") as f:
        names = {r["model"] for r in csv.DictReader(f)}
    for n in sorted(names - unknown_arch):
        get_model(n)


def test_unknown_model_suggests():
    with pytest.raises(UnknownNameError, match="closest: DeepSeek-V3"):
        get_model("DeepSeekV33")


def test_every_model_has_source_and_structure():
    for m in list_models():
        assert m.source and m.hf_id, m.name
        if m.is_moe:
            assert m.num_moe_experts and m.moe_router_topk <= m.num_moe_experts
        if m.mtp_num_layers:
            assert m.name not in ("DeepSeek-V3 (w/o MTP)",)
    assert get_model("DeepSeek-V3 (w/o MTP)").mtp_num_layers == 0
    assert get_model("DeepSeek-V3").mlp_pattern.startswith("DDDE")
    assert get_model("GLM-4.5").mlp_pattern.startswith("DDDE")
    assert get_model("Llama-4-Maverick").mlp_pattern == "DE" * 24
    assert get_model("Qwen3-Next-80B-A3B").mixer_pattern == "GGGA" * 12


def test_pickled_spec_hashes_afresh_in_the_receiving_process():
    """The cached hash must not travel with a pickle: string hashing is salted per process."""
    import pickle
    import subprocess
    import sys

    from moetune.catalog.models import get_model

    m = get_model("DeepSeek-V3")
    hash(m)  # cache it here
    blob = pickle.dumps(m)
    assert "_moetune_hash" not in pickle.loads(blob).__dict__
    code = ("import pickle,sys; from moetune.catalog.models import get_model; "
            "m = pickle.loads(sys.stdin.buffer.read()); print(hash(m) == hash(get_model('DeepSeek-V3')))")
    out = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, check=True)
    assert out.stdout.strip() == b"True"
