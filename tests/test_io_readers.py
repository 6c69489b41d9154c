"""Config readers: Hydra overrides, Megatron-LM arguments (string and model_config.yaml), Bridge YAML."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import DATA
from moetune.errors import InputError
from moetune.io.bridge import read_bridge_config
from moetune.io.config_to_job import config_to_bridge_overrides, config_to_megatron_args
from moetune.io.megatron_args import parse_moe_layer_freq, read_megatron_args
from moetune.overrides import apply_overrides, format_value, parse_override, parse_value


def test_parse_override_values():
    assert parse_override("model.expert_model_parallel_size=16") == ("model.expert_model_parallel_size", 16, "set")
    assert parse_override("comm_overlap.overlap_moe_expert_parallel_comm=true")[1] is True
    assert parse_override("model.recompute_modules=[core_attn,moe_act]")[1] == ["core_attn", "moe_act"]
    assert parse_override("model.fp8=null")[1] is None
    assert parse_override("env_vars.PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")[1] == \
        "expandable_segments:True"
    assert parse_override("+model.new_field=1")[2] == "add"
    assert parse_override("~model.fp8")[2] == "del"


@pytest.mark.parametrize("bad", ["model.tp", "=3", "model..x=1", "mo-del.x=1"])
def test_bad_override_is_one_line_error(bad):
    with pytest.raises(InputError) as e:
        parse_override(bad)
    assert "\n" not in str(e.value) and repr(bad)[1:-1] in str(e.value)


@given(st.one_of(st.integers(-10**6, 10**6), st.booleans(), st.none(),
                 st.lists(st.sampled_from(["attn", "moe_router", "core_attn"]), max_size=3),
                 st.sampled_from(["alltoall", "flex", "bfloat16"])))
def test_override_value_round_trip(v):
    assert parse_value(format_value(v)) == v


def test_apply_overrides_does_not_mutate():
    base = {"model": {"a": 1}}
    out = apply_overrides(base, ["model.a=2", "train.global_batch_size=8"])
    assert base == {"model": {"a": 1}} and out == {"model": {"a": 2}, "train": {"global_batch_size": 8}}


def test_megatron_args_string():
    cfg = read_megatron_args("--num-layers 16 --hidden-size 1024 --tensor-model-parallel-size 2 --bf16 "
                             "--recompute-modules core_attn moe_act --moe-layer-freq ([0]*1+[1]*15) --swiglu "
                             "--num-layers-per-virtual-pipeline-stage 2 --pipeline-model-parallel-size 2")
    m = cfg["model"]
    assert cfg["frontend"] == "megatron-lm"
    assert m["num_layers"] == 16 and m["tensor_model_parallel_size"] == 2 and m["bf16"] is True
    assert m["recompute_modules"] == ["core_attn", "moe_act"]
    assert m["moe_layer_freq"] == [0] + [1] * 15
    assert m["virtual_pipeline_model_parallel_size"] == 4 and m["gated_linear_unit"] is True
    assert cfg["optimizer"]["bf16"] is True


@pytest.mark.parametrize("extra,want", [("", True), ("--grad-reduce-in-bf16", False),
                                        ("--main-grads-dtype bf16", None), ("--accumulate-allreduce-grads-in-fp32", True)])
def test_megatron_args_bf16_reduces_grads_in_fp32(extra, want):
    """megatron/training/arguments.py validate_args: --bf16 accumulates and all-reduces gradients in FP32 (FP32 DDP
    gradient buffers) unless --grad-reduce-in-bf16 or a BF16 --main-grads-dtype."""
    cfg = read_megatron_args(f"--num-layers 4 --hidden-size 256 --bf16 {extra}")
    assert cfg.get("ddp", {}).get("grad_reduce_in_fp32") is want
    assert "grad_reduce_in_fp32" not in read_megatron_args("--num-layers 4 --hidden-size 256").get("ddp", {})


@pytest.mark.parametrize("text,needle", [
    ("--num-layers 4 --bogus-flag 3", "--bogus-flag"),
    ("--num-layers four", "--num-layers"),
    ("--num-layers 4 --num-layers 5", "contradicts"),
    ("--moe-layer-freq ([0]*1+[1]*__import__('os'))", "--moe-layer-freq"),
    ("--tensor-model-parallel-size 2.5", "--tensor-model-parallel-size"),
])
def test_megatron_args_errors(text, needle):
    with pytest.raises(InputError) as e:
        read_megatron_args(text)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_moe_layer_freq_forms():
    assert parse_moe_layer_freq("([0]*3+[1]*5)") == [0, 0, 0, 1, 1, 1, 1, 1]
    assert parse_moe_layer_freq(2) == 2
    assert parse_moe_layer_freq("[0,1]*2") == [0, 1, 0, 1]


def test_golden_model_config_yaml(shared_data):
    cfg = read_megatron_args(DATA / "megatron_golden" / "case_gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed_config.yaml")
    m = cfg["model"]
    assert (m["tensor_model_parallel_size"], m["pipeline_model_parallel_size"], m["expert_model_parallel_size"],
            m["expert_tensor_parallel_size"], m["virtual_pipeline_model_parallel_size"]) == (2, 2, 4, 1, 4)
    assert m["num_moe_experts"] == 32 and m["moe_layer_freq"] == [0] + [1] * 15 and m["multi_latent_attention"]
    assert cfg["env_vars"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert cfg["rerun_state_machine"]["check_for_nan_in_loss"] is False


def test_every_golden_config_round_trips_through_megatron_args(shared_data):
    for path in sorted((DATA / "megatron_golden").glob("*_config.yaml")):
        cfg = read_megatron_args(path)
        back = read_megatron_args(shlex.join(config_to_megatron_args(cfg)))
        for sec, d in cfg.items():
            if isinstance(d, dict) and sec != "env_vars":
                assert back.get(sec) == d, (path.name, sec)


def test_bridge_yaml_with_targets_and_overrides(tmp_path):
    p = tmp_path / "cfg.yaml"
    p.write_text("""
model:
  _target_: megatron.bridge.models.gpt_provider.GPTModelProvider
  tensor_model_parallel_size: 2
  params_dtype:
    _target_: torch.bfloat16
    _call_: false
  num_moe_experts: 8
dataset:
  _target_: megatron.bridge.training.config.GPTSFTDatasetConfig
  seq_length: 4096
train:
  global_batch_size: 32
""")
    cfg = read_bridge_config(p, ["model.expert_model_parallel_size=4", "comm_overlap.tp_comm_overlap=false"])
    assert cfg["frontend"] == "bridge"
    assert cfg["model"]["params_dtype"] == "bfloat16" and cfg["model"]["expert_model_parallel_size"] == 4
    assert cfg["dataset"]["_class"] == "GPTSFTDatasetConfig"
    assert "model.expert_model_parallel_size=4" in config_to_bridge_overrides(cfg)


@pytest.mark.parametrize("text,needle", [("model: [1, 2]", "model"), ("- a\n- b", "mapping"),
                                         ("model: {a: 1}\nbogus_section: {}", "bogus_section"),
                                         ("model: {a: [1,", "YAML")])
def test_bridge_yaml_errors(tmp_path, text, needle):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(InputError) as e:
        read_bridge_config(p)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_missing_file():
    with pytest.raises(InputError, match="no such file"):
        read_bridge_config("/nonexistent/cfg.yaml")


@pytest.mark.parametrize("name", ["memory.yaml", "efficiency.yaml", "uncertainty.yaml", "kernel_taxonomy.yaml"])
def test_load_yaml_reads_the_catalogs_as_safe_load(name):
    """moetune.files.load_yaml (libyaml's parser where PyYAML has it) gives the values of ``yaml.safe_load``, types
    included (1 vs 1.0, '1e9' strings, dates), on every shipped catalog YAML."""
    from importlib import resources

    import yaml

    from moetune.files import load_yaml

    text = (resources.files("moetune.catalog") / name).read_text()
    want, got = yaml.safe_load(text), load_yaml(text)

    def typed(x):
        if isinstance(x, dict):
            return {k: typed(v) for k, v in x.items()}
        if isinstance(x, list):
            return [typed(v) for v in x]
        return (type(x).__name__, x)

    assert want and typed(got) == typed(want)


def test_load_yaml_rejects_what_safe_load_rejects():
    import yaml

    from moetune.files import load_yaml

    with pytest.raises(yaml.YAMLError):
        load_yaml("a: [1, 2")
    with pytest.raises(yaml.YAMLError):
        load_yaml("!!python/object:os.system {}")
