"""Per-release Bridge workload presets (moetune.catalog.release_configs) and their use for published rows."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest

from moetune.catalog.models import get_model
from moetune.catalog.release_configs import preset_features, publishing_presets, release_preset, releases
from moetune.io.load import build_published_job
from moetune.perfmodel.calibration import read_measured_csv

DATA = Path(__file__).resolve().parents[1] / "data"
QWEN_B200 = dict(gpus=8, tp=1, pp=1, cp=1, vp=None, ep=8, etp=None, gbs=512)


def test_catalog_file_has_its_provenance_and_releases_in_order():
    raw = json.loads(resources.files("moetune.catalog").joinpath("release_configs.json").read_text())
    assert "Megatron-Bridge" in raw["_source"] and "extract_release_configs" in raw["_source"]
    rels = releases()
    assert rels[0] == "25.11" and "26.08" not in rels  # 26.08 was published with the flat recipes
    dates = [raw["releases"][r]["date"] for r in rels]
    assert dates == sorted(dates)
    for r in rels:
        assert len(raw["releases"][r]["commit"]) == 40


def test_qwen3_b200_dispatcher_follows_the_release():
    """25.11: no flex backend in the B200 preset (alltoall); 26.02: DeepEP; 26.02.01: HybridEP with attention graphs
    (Bridge 0ec1df783 moved the B200 preset to HybridEP on 2026-02-27)."""
    seen = {}
    for rel, mbs in (("25.11", 1), ("26.02", 1), ("26.02.01", 4)):
        p = release_preset("Qwen3-30B-A3B", "DGX-B200", "mxfp8", rel, mbs=mbs, **QWEN_B200)
        assert p is not None and p.release == rel
        upd, notes = preset_features(p, "B200")
        seen[rel] = (upd["moe_token_dispatcher_type"], upd["moe_flex_dispatcher_backend"], upd["cuda_graph_scope"])
        assert p.name in notes[0]
    assert seen["25.11"] == ("alltoall", None, ("moe_router", "moe_preprocess"))
    assert seen["26.02"][:2] == ("flex", "deepep")
    assert seen["26.02.01"] == ("flex", "hybridep", ("attn", "moe_router", "moe_preprocess"))


def test_deepseek_v3_gb300_25_11_table_layout_cannot_exist_and_the_preset_can():
    """The 25.11 table gives DeepSeek-V3 on 256 GB300 as TP1 PP8 VP2 EP64, which Megatron-Core cannot build (ETP*EP*PP
    = 512 does not divide 256); the release's GB300 FP8-MX preset at the publishing commit runs PP4 VP4 EP64."""
    from moetune.spec.validate import world_size_violation

    assert "PAR-002" in world_size_violation(1, 1, 8, 64, 1, 256)
    got = publishing_presets("DeepSeek-V3", "DGX-GB300", "mxfp8", "25.11", gpus=256, gbs=2048)
    assert [p.name for p in got] == ["DEEPSEEK_V3_PRETRAIN_CONFIG_GB300_FP8_MX_BASE_CONFIG"]
    f = got[0].fields
    lay = (f["tensor_model_parallel_size"], f["pipeline_model_parallel_size"],
           f["virtual_pipeline_model_parallel_size"], f["expert_model_parallel_size"])
    assert lay == (1, 4, 4, 64) and world_size_violation(1, 1, 4, 64, 1, 256) is None
    assert publishing_presets("DeepSeek-V3", "DGX-GB300", "mxfp8", "25.11", gpus=128, gbs=2048) == ()


def test_plan_bench_prices_an_impossible_table_layout_with_the_release_preset(monkeypatch):
    """bench/plan_vs_published: the impossible 25.11 DeepSeek-V3 GB300 row is stated as a table fact and priced with
    its release preset's layout; a possible layout passes through; without a preset the row says why."""
    import csv

    monkeypatch.syspath_prepend(str(DATA.parent / "bench"))
    import plan_vs_published as bench

    rows = [r for r in csv.DictReader((DATA / "perf" / "mbridge_perf_calibration.csv").open())
            if r["release"] == "25.11" and r["model"] == "DeepSeekV3" and r["system"] == "DGX-GB300"
            and r["pp"] == "8" and r["ep"] == "64"]
    assert len(rows) == 1
    (key, kw, pub), note = bench._row_setup(rows[0])
    assert (pub["tp"], pub["pp"], pub["vpp"], pub["ep"], pub["mbs"]) == (1, 4, 4, 64, 1)
    assert "table layout cannot exist" in note and "PAR-002" in note and "GB300_FP8_MX_BASE_CONFIG" in note
    ok = {"tp": 1, "pp": 4, "cp": 1, "vpp": 4, "ep": 64, "mbs": 1}
    assert bench._possible_layout(rows[0], "DeepSeek-V3", "DGX-GB300", "mxfp8", 256, 2048, ok) == (ok, "")
    gone, why = bench._possible_layout({"release": "26.08"}, "DeepSeek-V3", "DGX-GB300", "mxfp8", 256, 2048,
                                       {**ok, "pp": 8})
    assert gone is None and "no preset" in why


def test_a_preset_needs_the_rows_parallelism_and_prefers_its_batch():
    exact = release_preset("Qwen3-30B-A3B", "DGX-B200", "mxfp8", "25.11", mbs=1, **QWEN_B200)
    other_batch = release_preset("Qwen3-30B-A3B", "DGX-B200", "mxfp8", "25.11", mbs=4, **QWEN_B200)
    assert exact is not None and other_batch is not None and other_batch.fields["micro_batch_size"] == 1
    assert release_preset("Qwen3-30B-A3B", "DGX-B200", "mxfp8", "25.11", mbs=1, **{**QWEN_B200, "ep": 4}) is None
    assert release_preset("Qwen3-30B-A3B", "DGX-B200", "mxfp8", "26.08", mbs=4, **QWEN_B200) is None
    assert release_preset("Qwen3-30B-A3B", "DGX-B200", "mxfp8", "not-a-release", mbs=1, **QWEN_B200) is None


def test_hybridep_device_gate_of_25_11_keeps_alltoall_off_gb200():
    """At 97ad8cc6f ``apply_flex_dispatcher_backend`` applied HybridEP on GB200/GB300 only."""
    p = release_preset("Qwen3-30B-A3B", "DGX-GB200", "mxfp8", "25.11", gpus=8, tp=1, pp=1, cp=1, vp=None, ep=8,
                       etp=None, gbs=512, mbs=4)
    assert p is not None and p.flex_gate["hybridep"] == "GB200,GB300"
    assert preset_features(p, "GB200")[0]["moe_flex_dispatcher_backend"] == "hybridep"
    upd, notes = preset_features(p, "H100")
    assert upd["moe_token_dispatcher_type"] == "alltoall" and any("device gate" in n for n in notes)


def test_moe_a2a_overlap_means_ep_overlap_and_delayed_wgrad():
    p = release_preset("Qwen3-30B-A3B", "DGX-H100", "fp8_cs", "25.11", gpus=16, tp=1, pp=2, cp=1, vp=12, ep=8,
                       etp=None, gbs=512, mbs=1)
    assert p is not None
    upd, _ = preset_features(p, "H100")
    assert upd["overlap_moe_expert_parallel_comm"] and upd["delay_wgrad_compute"]
    assert upd["cuda_graph_impl"] == "none"


def test_published_rows_take_their_release_preset():
    runs, _ = read_measured_csv(DATA / "perf" / "mbridge_perf_calibration.csv", job_builder=build_published_job)
    with_preset = [r for r in runs if any(a.startswith("features of Bridge preset") for a in r.job.assumptions)]
    assert len(with_preset) >= 120
    assert all(r.release in releases() for r in with_preset)
    row = next(r for r in runs if r.label.startswith("line 162:"))  # Qwen3-30B-A3B DGX-B200 25.11, MBS1
    f = row.job.features
    assert (f.moe_token_dispatcher_type, f.cuda_graph_scope) == ("alltoall", ("moe_router", "moe_preprocess"))


@pytest.mark.parametrize("release", [None, "26.08"])
def test_without_a_preset_the_current_recipe_is_used(release):
    kw = dict(model=get_model("Qwen3-30B-A3B"), system="DGX-B200", gpus=8, precision="mxfp8", gbs=512, mbs=4,
              seq=4096, tp=1, pp=1, cp=1, vp=None, ep=8)
    job = build_published_job(**kw, release=release)
    assert job.features == build_published_job(**kw).features
    assert not any("preset" in a for a in job.assumptions)


def test_a_row_the_publishing_commit_no_longer_has_takes_the_earlier_version():
    """26.02 Qwen3-30B-A3B H100 (PP2 VP12 MBS1, GBS 1024): by c0b9a0003 the preset had moved to EP16 without PP, so
    the row's own layout is found in an earlier version of the same release window."""
    p = release_preset("Qwen3-30B-A3B", "DGX-H100", "fp8_cs", "26.02", gpus=16, tp=1, pp=2, cp=1, vp=12, ep=8,
                       etp=None, gbs=1024, mbs=1)
    assert p is not None and p.fields["pipeline_model_parallel_size"] == 2
    assert not p.commit.startswith("c0b9a0003")


def test_offloading_and_unmodelled_fields_of_a_preset():
    from moetune.catalog.release_configs import ReleasePreset

    p = ReleasePreset("26.06", "X_PRETRAIN_CONFIG_GB300_FP8_MX_FSDP", "0" * 40,
                      {"fine_grained_activation_offloading": True, "offload_modules": ["core_attn", "attn_proj"],
                       "cpu_offloading_num_layers": 2, "cutedsl_fused_grouped_mlp": True, "use_megatron_fsdp": True},
                      {"hybridep": "sm8x,sm9x,sm10x", "deepep": "sm8x,sm9x,B200,B300"})
    upd, notes = preset_features(p, "GB300")
    assert upd["fine_grained_activation_offloading"] and upd["offload_modules"] == ("core_attn", "attn_proj")
    assert upd["cpu_offloading"] and upd["cpu_offloading_num_layers"] == 2 and upd["use_megatron_fsdp"]
    assert upd["cutedsl_fused_grouped_mlp"] is True
    assert not any("not modelled" in n for n in notes)


def _tool():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "tools" / "extract_release_configs.py"
    spec = importlib.util.spec_from_file_location("extract_release_configs", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_extraction_tool_reads_presets_and_the_flex_gate_from_source_text():
    tool = _tool()
    utils = '''
import torch
from dataclasses import dataclass
@dataclass
class WorkloadBaseConfig:
    num_gpus: int = 1
    micro_batch_size: int = 1
    moe_flex_dispatcher_backend: Optional[str] = None
    cuda_graph_scope: Optional[List[str]] = None
'''
    cls = tool._dataclass_of(utils)
    module = '''
from dataclasses import replace
from utils.utils import WorkloadBaseConfig
BASE_X = WorkloadBaseConfig(num_gpus=8)
X_PRETRAIN_CONFIG_B200_BF16_V1 = replace(BASE_X, micro_batch_size=4, cuda_graph_scope=["attn"])
X_PRETRAIN_CONFIG_B200_FP8_MX_V1 = X_PRETRAIN_CONFIG_B200_BF16_V1
X_SFT_CONFIG_B200_BF16_V1 = BASE_X
'''
    got = tool._presets(module, "x_workload_base_configs.py", cls)
    assert got == {"X_PRETRAIN_CONFIG_B200_BF16_V1": {"num_gpus": 8, "micro_batch_size": 4, "cuda_graph_scope": ["attn"]},
                   "X_PRETRAIN_CONFIG_B200_FP8_MX_V1": {"num_gpus": 8, "micro_batch_size": 4,
                                                        "cuda_graph_scope": ["attn"]}}
    old = 'elif moe_flex_dispatcher_backend == "hybridep":\n  if not (x.name in ["NVIDIA GB200", "NVIDIA GB300"]):\nelse:'
    new = 'elif moe_flex_dispatcher_backend == "hybridep":\n  if not device_properties.major in [8, 9, 10]:\nelse:'
    assert tool._flex_gate(old)["hybridep"] == "GB200,GB300"
    assert tool._flex_gate(new)["hybridep"] == "sm8x,sm9x,sm10x"


def test_a_table_vp_mbs_no_preset_has_take_the_publishing_presets():
    """26.02.01 Llama-3-70B 64 GB300 MXFP8: the table says TP1 PP4 MBS2 without VP; every GB300 FP8_MX preset of the
    publishing commit cfeddcd (V1 GBS 128, V2 GBS 256) runs PP4 VP5 MBS1. The job is built as the V2 preset ran
    (MBS1 VP5: it fits, where MBS2 without VP needs ~270 GiB of activations); a row whose layout and batch match a
    preset keeps them."""
    from moetune.catalog.release_configs import run_preset
    from moetune.perfmodel.memory import estimate_memory

    kw = dict(gpus=64, tp=1, pp=4, cp=1, ep=1, etp=None, gbs=256)
    p = run_preset("Llama-3-70B", "DGX-GB300", "mxfp8", "26.02.01", vp=None, mbs=2, **kw)
    assert p is not None and p.name == "LLAMA3_70B_PRETRAIN_CONFIG_GB300_FP8_MX_V2"
    assert run_preset("Llama-3-70B", "DGX-GB300", "mxfp8", "26.02.01", vp=5, mbs=1, **kw) is None
    assert run_preset("Llama-3-70B", "DGX-GB300", "mxfp8", "26.02.01", vp=None, mbs=2, **{**kw, "pp": 8}) is None
    job = build_published_job(model=get_model("Llama-3-70B"), system="DGX-GB300", gpus=64, precision="mxfp8",
                              gbs=256, mbs=2, seq=8192, tp=1, pp=4, cp=1, vp=None, ep=1, release="26.02.01")
    assert (job.micro_batch_size, job.layout.vpp_size) == (1, 5)
    assert any("match no preset" in a and "FP8_MX_V2" in a for a in job.assumptions)
    assert estimate_memory(job).fits
    # without the release the table's cells stand
    plain = build_published_job(model=get_model("Llama-3-70B"), system="DGX-GB300", gpus=64, precision="mxfp8",
                                gbs=256, mbs=2, seq=8192, tp=1, pp=4, cp=1, vp=None, ep=1)
    assert (plain.micro_batch_size, plain.layout.vpp_size) == (2, 1)


def test_gpt_oss_h100_25_11_runs_the_presets_micro_batch(monkeypatch):
    """25.11 GPT-OSS-120B 64 H100: the table gives MBS4 (the B200 / GB200 presets' value); the H100 preset of the
    publishing commit 97ad8cc runs PP4 EP8 MBS1 at the same GPU count and batch. The plan bench pins that layout."""
    import csv

    monkeypatch.syspath_prepend(str(DATA.parent / "bench"))
    import plan_vs_published as bench

    rows = [r for r in csv.DictReader((DATA / "perf" / "mbridge_perf_calibration.csv").open())
            if r["release"] == "25.11" and r["model"] == "GPT OSS 120B" and r["system"] == "DGX-H100"]
    assert len(rows) == 1 and rows[0]["mbs"] == "4"
    (_, kw, pub), note = bench._row_setup(rows[0])
    assert (pub["pp"], pub["ep"], pub["vpp"], pub["mbs"]) == (4, 8, 1, 1)
    assert "GPT_OSS_120B_PRETRAIN_CONFIG_H100_BF16_BASE_CONFIG" in note
    job = build_published_job(model=kw["model"], system="DGX-H100", gpus=64, precision="bf16", gbs=512, mbs=4,
                              seq=4096, tp=1, pp=4, cp=1, vp=None, ep=8, release="25.11")
    assert job.micro_batch_size == 1 and job.features.recompute_modules == ("layernorm", "moe_act")


def test_plan_bench_labels_fine_tuning_rows_with_their_task(monkeypatch, capsys):
    """The table's ``lora`` / ``sft`` rows are planned and priced as their task (published_task): --classify names
    the task before the cause, and a LoRA row's plan request carries the release preset's rank and targets."""
    monkeypatch.syspath_prepend(str(DATA.parent / "bench"))
    import plan_vs_published as bench

    rows = {"pretrain": {"release": "26.06", "model": "M", "system": "S", "num_gpus": "8", "precision": "MXFP8",
                         "task": "pretrain", "tp": "1", "pp": "2", "cp": "1", "vp": "20", "ep": "1", "mbs": "1"}}
    rows["lora"] = {**rows["pretrain"], "task": "lora"}
    res = {"rank": 25, "rank_distinct": 12, "gap": 0.15, "ok": False, "ok_distinct": False, "top1": "-",
           "pub_t": 1.0, "best_t": 0.9}
    monkeypatch.setattr(bench, "plan_rows", lambda rs: [(r, res, "") for r in rows.values()])
    monkeypatch.setattr(bench, "classify_miss", lambda r, res: "memory: recipe needs more")
    bench.main(["--classify", "--match", "nothing-matches"])
    out = capsys.readouterr().out
    assert "misses by cause: memory 1, task lora 1" in out
    real = {**rows["lora"], "model": "LLAMA3_70B", "system": "DGX-GB200", "gbs": "32", "seq_len": "4096"}
    (_, kw, pub), _ = bench._row_setup(real)
    assert dict(kw["task"]) == {"task": "lora", "lora_dim": 16, "lora_alpha": 32, "lora_target_modules": ("linear_qkv",)}
    (_, kw, _), _ = bench._row_setup({**real, "task": "pretrain"})
    assert kw["task"] == ()
