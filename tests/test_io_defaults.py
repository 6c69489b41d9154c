"""Config readers fill Megatron-LM / Megatron-Bridge defaults the way the libraries do, and record each one in
``Job.assumptions``: tied embeddings, LayerNorm, the --swiglu ffn size, tokenizer vocabularies, the memory-relevant
Features fields; non-numeric integer fields are one-line InputErrors in every reader path."""

from __future__ import annotations

import pytest

from conftest import DATA, run_cli
from moetune.errors import InputError
from moetune.io.bridge import load_bridge_dict, read_bridge_config
from moetune.io.config_to_job import job_from_config, tokenizer_vocab
from moetune.io.effective import effective_config
from moetune.io.megatron_args import read_megatron_args

GOLDEN = DATA / "megatron_golden"

BASE = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 --max-position-embeddings 1024 "
        "--global-batch-size 8 --micro-batch-size 1 --vocab-file vocab.json --merge-file merges.txt")

BRIDGE = """
model:
  num_layers: 4
  hidden_size: 512
  num_attention_heads: 8
  vocab_size: 32000
  seq_length: 1024
  tensor_model_parallel_size: 1
train:
  global_batch_size: 8
  micro_batch_size: 1
"""


def _golden(case: str, gpus: int = 8):
    return job_from_config(read_megatron_args(GOLDEN / f"case_{case}_config.yaml"), gpus=gpus)


def _mlm(extra: str = "", gpus: int = 8):
    return job_from_config(read_megatron_args(f"{BASE} {extra}"), gpus=gpus)


def _bridge(extra: dict | None = None, overrides: list[str] | None = None):
    cfg = load_bridge_dict(BRIDGE)
    for k, v in (extra or {}).items():
        cfg["model"][k] = v
    return job_from_config(read_bridge_config(None, overrides, base=cfg), gpus=8)


def _noted(job, *words: str) -> bool:
    return any(all(w in a for w in words) for a in job.assumptions)


# 1. tied embeddings -----------------------------------------------------------------------------------------------
def test_mlm_ties_embeddings_unless_untie_flag(shared_data):
    tied = _golden("gpt3_mcore_te_tp1_pp1_te_4experts_groupedGEMM_op_fuser")
    assert not tied.model.untie_embeddings_and_output_weights
    assert _noted(tied, "share_embeddings_and_output_weights", "tied")
    untied = _golden("gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed")
    assert untied.model.untie_embeddings_and_output_weights
    assert not _mlm().model.untie_embeddings_and_output_weights
    assert _mlm("--untie-embeddings-and-output-weights").model.untie_embeddings_and_output_weights


def test_bridge_ties_by_default_and_honours_explicit_false():
    job = _bridge()
    assert not job.model.untie_embeddings_and_output_weights  # GPTModelProvider default True
    assert _noted(job, "share_embeddings_and_output_weights")
    assert _bridge({"share_embeddings_and_output_weights": False}).model.untie_embeddings_and_output_weights


# 2. normalization -------------------------------------------------------------------------------------------------
def test_normalization_defaults_to_layernorm(shared_data):
    job = _golden("gpt3_mcore_cp2_pp2_ep2_te_4experts2parallel_nondeterministic")
    assert job.model.normalization == "LayerNorm" and _noted(job, "normalization", "LayerNorm")
    assert _golden("mixtral_8x7b_tp1pp4ep8vpp8_release", 64).model.normalization == "RMSNorm"
    assert _bridge().model.normalization == "LayerNorm"
    assert _bridge({"normalization": "RMSNorm"}).model.normalization == "RMSNorm"
    with pytest.raises(InputError, match="model.normalization"):
        _bridge({"normalization": "BatchNorm"})


# 3. ffn_hidden_size -----------------------------------------------------------------------------------------------
def test_swiglu_ffn_default(shared_data):
    assert _golden("gpt3_mcore_te_tp1_pp1_te_4experts_groupedGEMM_op_fuser").model.ffn_hidden_size == 1344  # h=512
    job = _mlm("--swiglu")
    assert job.model.ffn_hidden_size == int((4 * 1024 * 2 / 3) / 64) * 64 == 2688
    assert _noted(job, "ffn_hidden_size", "swiglu")
    assert _mlm().model.ffn_hidden_size == 4096
    assert _mlm("--swiglu --ffn-hidden-size 3000").model.ffn_hidden_size == 3000
    # MCore TransformerConfig (Bridge) ignores the GLU for the default: 4*h
    assert _bridge({"gated_linear_unit": True}).model.ffn_hidden_size == 2048


# 4. tokenizer vocabularies ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case,gpus,vocab", [
    ("gpt3_15b_8t_release_sm", 64, 256000),                     # GPTSentencePieceTokenizer nemotron_2_256k.model
    ("mixtral_8x7b_alltoall_tp2pp4ep4_release_sm", 64, 256000),
    ("mixtral_8x7b_tp1pp4ep8vpp8_release", 64, 32000),           # Llama2Tokenizer
    ("gpt3_7b_tp1_pp4_memory_speed", 8, 131074),                 # NullTokenizer --vocab-size 131073 (+ eod)
    ("gpt3_mcore_te_tp2_pp1_te_8experts_etp1_ep4", 8, 50257),    # GPT-2 BPE vocab.json
])
def test_golden_vocab(shared_data, case, gpus, vocab):
    job = _golden(case, gpus)
    assert job.model.vocab_size == vocab
    assert _noted(job, "vocab_size")


def test_vocab_padding_to_divisible_by_times_tp(shared_data):
    job = _golden("mixtral_8x7b_alltoall_tp2pp4ep4_release_sm", 64)  # --make-vocab-size-divisible-by 128, TP2
    assert job.model.padded_vocab_size(job.layout.tp) == 256000  # 256000 % 256 == 0
    null = _golden("gpt3_7b_tp1_pp4_memory_speed")
    assert null.model.make_vocab_size_divisible_by == 128 and _noted(null, "make_vocab_size_divisible_by")
    assert null.model.padded_vocab_size(1) == 131200
    assert _mlm("--make-vocab-size-divisible-by 64").model.padded_vocab_size(2) == 50304


def test_tokenizer_vocab_table():
    notes: list[str] = []
    assert tokenizer_vocab({"tokenizer_type": "NullTokenizer", "vocab_size": 1000}, notes) == 1001
    assert tokenizer_vocab({"tokenizer_type": "Llama2Tokenizer"}, notes) == 32000
    assert tokenizer_vocab({"tokenizer_type": "GPT2BPETokenizer"}, notes) == 50257
    assert tokenizer_vocab({"tokenizer_type": "HuggingFaceTokenizer", "tokenizer_model": "Qwen/Qwen3-30B-A3B"},
                           notes) == 151936
    assert len(notes) == 4
    unknown: list[str] = []
    tokenizer_vocab({"tokenizer_type": "HuggingFaceTokenizer", "tokenizer_model": "org/not-in-catalog"}, unknown)
    assert unknown and "assumed" in unknown[0] and "org/not-in-catalog" in unknown[0]
    with pytest.raises(InputError, match="NullTokenizer"):
        tokenizer_vocab({"tokenizer_type": "NullTokenizer"}, [])


# 5. memory-relevant Features fields -------------------------------------------------------------------------------
def test_features_from_mlm_flags():
    f = _mlm("--attention-backend unfused --transformer-impl local --attention-dropout 0.0 --hidden-dropout 0.2 "
             "--cross-entropy-loss-fusion --cross-entropy-fusion-impl te").features
    assert (f.attention_backend, f.transformer_impl, f.attention_dropout, f.hidden_dropout) == \
        ("unfused", "local", 0.0, 0.2)
    assert f.cross_entropy_loss_fusion and f.cross_entropy_fusion_impl == "te"
    d = _mlm().features  # MLM / MCore defaults
    assert (d.attention_backend, d.transformer_impl, d.attention_dropout, d.hidden_dropout) == \
        ("auto", "transformer_engine", 0.1, 0.1)
    assert not d.cross_entropy_loss_fusion and d.cross_entropy_fusion_impl == "native"


def test_features_from_bridge_yaml():
    f = _bridge({"attention_backend": "AttnBackend.flash", "hidden_dropout": 0.0, "attention_dropout": 0.0,
                 "cross_entropy_loss_fusion": True, "cross_entropy_fusion_impl": "te"}).features
    assert f.attention_backend == "flash" and f.hidden_dropout == 0.0 and f.attention_dropout == 0.0
    assert f.cross_entropy_loss_fusion and f.cross_entropy_fusion_impl == "te"
    with pytest.raises(InputError, match="attention_backend"):
        _bridge({"attention_backend": "magic"})
    with pytest.raises(InputError, match="hidden_dropout"):
        _bridge(overrides=["model.hidden_dropout=lots"])


def test_golden_unfused_attention(shared_data):
    job = _golden("deepseek_proxy_fsdp_ep2_fsdp2_ep_overlap")
    assert job.features.attention_backend == "unfused"


# 7. non-numeric integer fields ------------------------------------------------------------------------------------
BAD = "model.tensor_model_parallel_size=abc"


def test_bad_int_every_reader_path():
    with pytest.raises(InputError, match="tensor_model_parallel_size.*abc"):
        read_bridge_config(None, [BAD], base=load_bridge_dict(BRIDGE))
    raw = load_bridge_dict(BRIDGE)
    raw["model"]["tensor_model_parallel_size"] = "abc"
    with pytest.raises(InputError, match="tensor_model_parallel_size"):
        effective_config(raw)
    with pytest.raises(InputError, match="tensor_model_parallel_size"):
        job_from_config(raw, gpus=8)
    with pytest.raises(InputError, match="tensor-model-parallel-size"):
        read_megatron_args(f"{BASE} --tensor-model-parallel-size abc")
    raw["model"]["tensor_model_parallel_size"] = 2.0  # integral values pass
    assert job_from_config(raw, gpus=8).layout.tp == 2


@pytest.mark.parametrize("cmd", ["check", "estimate"])
def test_bad_int_override_cli_one_line_exit_2(tmp_path, cmd):
    p = tmp_path / "run_config.yaml"
    p.write_text(BRIDGE)
    src = ("--bridge-config", str(p)) if cmd == "estimate" else (str(p),)
    proc = run_cli(cmd, *src, "--gpus", "8", BAD)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    err = proc.stderr.strip()
    assert "tensor_model_parallel_size" in err and "abc" in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err and proc.stdout == ""
