"""The assertion messages of data/logs/log_assert_*.txt, reproduced by checking the config that produced
them (reconstructed from the message and the source issue named in data/README.md)."""

from __future__ import annotations

import re

from conftest import DATA
from moetune.catalog.recipes import get_recipe, recipe_config
from moetune.io.check import check_config
from moetune.io.megatron_args import read_megatron_args
from moetune.overrides import apply_overrides
from moetune.rules import Env


def _assertion(name: str) -> str:
    text = (DATA / "logs" / name).read_text()
    lines = [ln.strip() for ln in text.splitlines() if re.match(r"\s*(AssertionError|RuntimeError|ValueError)", ln)]
    assert lines, name
    return lines[-1].split(":", 1)[1].strip()


def _norm(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", s.lower()).strip()


def test_world_size_not_divisible_by_expert_mesh(shared_data):
    # THUDM/slime#1818: PP2 x EP8 x ETP1 on 8 GPUs (Megatron-LM arguments; ETP given explicitly)
    msg = _assertion("log_assert_world_size_ep_1.txt")
    cfg = read_megatron_args("--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --num-experts 8 "
                             "--pipeline-model-parallel-size 2 --expert-model-parallel-size 8 "
                             "--expert-tensor-parallel-size 1 --micro-batch-size 1 --global-batch-size 8 "
                             "--seq-length 4096 --moe-token-dispatcher-type alltoall --bf16")
    res = check_config(cfg, Env(gpus=8))
    hit = [f for f in res.errors if f.id == "PAR-002"]
    assert hit and _norm(msg) in _norm(hit[0].message), (msg, [f.message for f in res.errors])


def test_expert_dp_not_divisible_by_distopt_instances(shared_data):
    # NVIDIA/Megatron-LM#4342: gpt3_mcore_te_tp2_pp1_resume_torch_dist_te_8experts2parallel_multi_dist_optimizer_
    # instances run on a 1-node GB200 (4 GPUs, PR #4334): TP2, EP2, ETP defaults to TP (MLM), 2 DistOpt instances
    msg = _assertion("log_assert_distopt_instances_1.txt")
    cfg = read_megatron_args("--num-layers 12 --hidden-size 512 --num-attention-heads 8 --num-experts 8 "
                             "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 1 "
                             "--expert-model-parallel-size 2 --sequence-parallel --use-distributed-optimizer "
                             "--num-distributed-optimizer-instances 2 --micro-batch-size 4 --global-batch-size 32 "
                             "--seq-length 1024 --moe-grouped-gemm --disable-bias-linear --bf16")
    res = check_config(cfg, Env(gpus=4, gpu="gb200"))
    hit = [f for f in res.errors if f.id == "PAR-007"]
    assert hit and _norm(msg) in _norm(hit[0].message), (msg, [f.message for f in res.errors])
    # the same job on the 8-GPU H100 node the test was written for is fine
    assert not [f for f in check_config(cfg, Env(gpus=8)).errors if f.id == "PAR-007"]


def test_ep_overlap_with_mtp_zero_before_fix(shared_data):
    # NVIDIA/Megatron-LM#5921: Bridge gpt_oss_120b_64gpu_gb200_bf16 recipe with EP overlap; the hybrid provider
    # defaults mtp_num_layers=0, which MCore before #5912 (megatron-core < 0.20) rejected
    msg = _assertion("log_assert_overlap_mtp_1.txt")
    name = "gpt_oss_120b_pretrain_64gpu_gb200_bf16_config"
    assert get_recipe(name)["config"]["comm_overlap"]["overlap_moe_expert_parallel_comm"] is True
    cfg = apply_overrides(recipe_config(name), ["model.mtp_num_layers=0"])
    env = Env.for_system("DGX-GB200", gpus=64, gpu="gb200", mcore="0.16.1")
    res = check_config(cfg, env)
    hit = [f for f in res.errors if f.id == "OVL-008"]
    assert hit and _norm(msg) in _norm(hit[0].message), (msg, [f.message for f in res.errors])
    # with the fixed MCore (or mtp_num_layers None) the recipe passes this rule
    assert not [f for f in check_config(cfg, Env.for_system("DGX-GB200", gpus=64, gpu="gb200", mcore="0.20.0"))
                .errors if f.id == "OVL-008"]
