"""job_from_config / job_to_config and check_job."""

from __future__ import annotations

import pytest

from conftest import DATA
from moetune.catalog.recipes import recipe_config
from moetune.errors import InputError
from moetune.io.check import check_config, check_job
from moetune.io.config_to_job import job_from_config, job_to_config
from moetune.io.megatron_args import read_megatron_args
from moetune.rules.engine import ERROR_SEVERITIES


def test_job_from_golden_config(shared_data):
    cfg = read_megatron_args(DATA / "megatron_golden" / "case_gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed_config.yaml")
    job = job_from_config(cfg, gpus=8)
    assert job.layout.tp == 2 and job.layout.pp == 2 and job.layout.vpp == 4 and job.layout.ep == 4
    assert job.layout.expert_tp == 1 and job.model.num_moe_experts == 32 and job.model.mlp_pattern[0] == "D"
    assert job.model.multi_latent_attention and job.global_batch_size == 32 and job.micro_batch_size == 4
    assert job.seq_length == 4096 and job.features.sequence_parallel
    assert any("vocab_size" in a for a in job.assumptions)


def test_mlm_etp_defaults_to_tp(shared_data):
    cfg = read_megatron_args(DATA / "megatron_golden" / "case_gpt3_mcore_tp2_pp2_ep2_te_4experts2parallel_config.yaml")
    job = job_from_config(cfg, gpus=8)
    assert job.layout.expert_tp == 2  # Megatron-LM: ETP defaults to TP (Bridge would use 1)
    assert job.features.moe_token_dispatcher_type == "allgather"


def test_job_from_recipe_and_back():
    cfg = recipe_config("qwen3_30b_a3b_pretrain_8gpu_b200_bf16_config")
    job = job_from_config(cfg)
    assert job.gpus == 8 and job.model.num_moe_experts == 128
    back = job_to_config(job)
    job2 = job_from_config(back, system=job.system, gpus=job.gpus)
    assert job2.layout == job.layout
    assert job2.features.moe_token_dispatcher_type == job.features.moe_token_dispatcher_type
    assert job2.features.precision == job.features.precision
    assert not [f for f in check_job(job) if f.severity in ERROR_SEVERITIES]


def test_check_job_finds_errors():
    job = job_from_config(recipe_config("qwen3_30b_a3b_pretrain_8gpu_b200_bf16_config"))
    bad = job.with_(features=job.features.model_copy(update={"sequence_parallel": False}),
                    layout=job.layout.model_copy(update={"tp": 2}))
    ids = {f.id for f in check_job(bad) if f.severity in ERROR_SEVERITIES}
    assert "PAR-046" in ids


def test_job_to_config_round_trips_through_checker():
    job = job_from_config(recipe_config("deepseek_v3_pretrain_256gpu_b200_bf16_config"))
    res = check_config(job_to_config(job))
    assert res.effective["model"]["num_moe_experts"] == 256


@pytest.mark.parametrize("cfg,needle", [({"model": {"num_layers": 4}}, "world size"),
                                        ({"model": {"num_layers": 4, "hidden_size": 8}}, "num_attention_heads")])
def test_job_from_config_errors(cfg, needle):
    with pytest.raises(InputError, match=needle):
        job_from_config(cfg, gpus=8 if needle != "world size" else None)


def test_bridge_overrides_round_trip_through_checker():
    from moetune.io.config_to_job import config_to_bridge_overrides
    from moetune.overrides import apply_overrides

    cfg = recipe_config("deepseek_v3_pretrain_256gpu_b200_bf16_config")
    rebuilt = apply_overrides({"frontend": "bridge"}, config_to_bridge_overrides(cfg))
    rebuilt["_meta"] = cfg["_meta"]
    assert check_config(rebuilt).effective["model"] == check_config(cfg).effective["model"]
