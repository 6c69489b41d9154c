"""Every Megatron-LM flag: the generated catalog (tools/gen_megatron_flags.py), the reader's argparse replay
(moetune.io.megatron_args), ignored flags listed once, errors naming file / flag / value, linear-time parsing on
multi-megabyte inputs, and every functional-test config in data/megatron_golden estimating from the CLI."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from conftest import DATA, REPO, run_cli
from moetune.errors import InputError
from moetune.io.config_to_job import config_to_megatron_args, job_from_config, job_to_config
from moetune.io.megatron_args import FLAGS, MODELED, catalog, catalog_flags, read_megatron_args, shell_words

BASE = ("--num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 --max-position-embeddings 1024 "
        "--micro-batch-size 2 --global-batch-size 16 --num-experts 4 --moe-router-topk 2 --bf16 --vocab-size 32000 "
        "--tokenizer-type NullTokenizer")
CONFIGS = sorted((DATA / "megatron_golden").glob("case_*_config.yaml"))


# ------------------------------------------------------------------------------------------------ the catalog
def test_catalog_names_its_source_and_counts_itself():
    cat = catalog()
    src = cat["source"]
    assert src["repository"] == "NVIDIA/Megatron-LM" and len(src["commit"]) == 40
    assert "megatron/training/arguments.py" in src["files"] and "megatron/training/argument_utils.py" in src["files"]
    assert cat["count"] == len(cat["flags"])
    assert sum(g["options"] for g in cat["groups"].values()) == cat["count"]
    assert sum(g["arguments"] for g in cat["groups"].values()) == cat["arguments"]
    # dataclass-generated groups are there (ArgumentGroupFactory), not only the hand-written add_argument calls
    for group in ("transformer configuration", "training", "checkpointing", "logging", "distributed init"):
        assert cat["groups"][group]["arguments"] > 0, group
    for rec in cat["flags"].values():
        assert rec["dest"] and rec["group"] and rec["action"] and rec["models"] in ("none", "memory", "time",
                                                                                     "memory+time")


@pytest.mark.parametrize("flag,dest,action", [
    ("--no-create-attention-mask-in-dataloader", "create_attention_mask_in_dataloader", "store_false"),
    ("--disable-bias-linear", "add_bias_linear", "store_false"),  # argparse_meta arg_names on a True bool
    ("--no-tp-comm-bulk-wgrad", "tp_comm_bulk_wgrad", "store_false"),  # generated --no-/--disable- pair
    ("--disable-tp-comm-bulk-wgrad", "tp_comm_bulk_wgrad", "store_false"),
    ("--norm-epsilon", "layernorm_epsilon", "store"),
    ("--num-layers", "num_layers", "store"),
    ("--untie-embeddings-and-output-weights", "untie_embeddings_and_output_weights", "store_true"),
    ("--no-ckpt-fully-parallel-save", "ckpt_fully_parallel_save", "store_false"),  # argparse_meta dest
])
def test_catalog_records_argparse_semantics(flag, dest, action):
    rec = catalog_flags()[flag]
    assert (rec["dest"], rec["action"]) == (dest, action)


def test_catalog_types_choices_nargs():
    f = catalog_flags()
    assert f["--attention-backend"]["choices"] == ["flash", "fused", "unfused", "local", "auto"]  # Enum members
    assert f["--fp8-format"]["choices"] == ["e4m3", "hybrid"]  # Literal
    assert f["--rampup-batch-size"]["nargs"] == 3  # argparse_meta nargs over list[int]'s '+'
    assert f["--moe-router-load-balancing-type"]["nargs"] == "+"
    assert f["--num-layers"]["type"] == "int" and f["--num-layers"]["default"] is None  # argparse_meta default


def test_every_mapped_flag_is_a_megatron_flag_of_the_same_kind():
    """The reader's table (and so the Megatron-LM launch lines moetune writes) uses only real flags, with the
    store_true / store_false / value kind Megatron gives them."""
    f = catalog_flags()
    for flag, (_targets, typ) in FLAGS.items():
        rec = f.get(f"--{flag}")
        assert rec is not None, flag
        if typ == "bool":
            assert rec["action"] == "store_true", flag
        elif typ == "nobool":
            assert rec["action"] == "store_false" or flag == "untie-embeddings-and-output-weights", flag
        else:
            assert rec["action"] == "store", flag
        if typ in ("list", "intlist"):
            assert rec.get("nargs") in ("+", "*", 3), flag
    for flag, effect in MODELED.items():
        assert f[flag]["models"] == effect, flag
    assert all(rec["models"] == "none" for o, rec in f.items() if o not in MODELED)


@pytest.mark.parametrize("name", ["Qwen3-30B-A3B", "DeepSeek-V3", "Mixtral-8x7B"])
def test_emitted_megatron_args_are_catalog_flags(name):
    from moetune.catalog.models import get_model
    from moetune.catalog.systems import get_system
    from moetune.spec import Features, Job, Layout

    job = Job(model=get_model(name), system=get_system("DGX-H100"), gpus=64, global_batch_size=512,
              micro_batch_size=1, seq_length=4096, layout=Layout(tp=2, pp=2, ep=8),
              features=Features(recompute_granularity="selective", use_distributed_optimizer=True,
                                exp_avg_dtype="bf16", main_grads_dtype="fp32"))
    args = config_to_megatron_args(job_to_config(job))
    flags = catalog_flags()
    for tok in args:
        if tok.startswith("--"):
            assert tok in flags, tok
    read_megatron_args(shlex.join(args))  # and they read back (choices included: --exp-avg-dtype bf16, not bfloat16)


# ------------------------------------------------------------------------------------------------ the generator
def _fake_megatron(root: Path) -> None:
    files = {
        "megatron/training/arguments.py": '''
            import argparse
            from megatron.training.argument_utils import ArgumentGroupFactory
            from megatron.core.cfg import CoreConfig

            def add_megatron_arguments(parser):
                parser = _add_a(parser)
                parser = _add_b(parser)
                return parser

            def _add_a(parser):
                exclude = ["hidden"]
                f = ArgumentGroupFactory(CoreConfig, exclude=exclude)
                f.build_group(parser, "core")
                group = parser.add_argument_group(title="extra")
                group.add_argument("--plain-int", type=int, default=3, help="x")
                group.add_argument("--no-thing", action="store_false", dest="thing")
                group.add_argument("--opt", action=argparse.BooleanOptionalAction, default=False)
                if HAVE_X:
                    group.add_argument("--only-with-x", type=str, choices=["a", "b"])
                return parser

            def _add_b(parser):
                from megatron.training.config import TrainCfg
                ArgumentGroupFactory(TrainCfg).build_group(parser, title="training")
                return parser
        ''',
        "megatron/training/argument_utils.py": "class ArgumentGroupFactory: pass\n",
        "megatron/core/cfg.py": '''
            import enum
            from dataclasses import dataclass, field
            from typing import Literal, Optional

            class Backend(enum.Enum):
                flash = 1
                auto = 2

            @dataclass
            class BaseCfg:
                tp_size: int = 1
                """Tensor parallel size."""

            @dataclass
            class CoreConfig(BaseCfg):
                num_layers: int = field(default=0, metadata={"argparse_meta": {"default": None}})
                use_bias: bool = True
                fused: bool = False
                backend: Backend = Backend.auto
                fmt: Optional[Literal["e4m3", "hybrid"]] = None
                sizes: list[int] = field(default_factory=list)
                eps: float = field(default=1e-5, metadata={"argparse_meta": {"arg_names": ["--norm-eps"]}})
                hidden: Optional[int] = None
                derived: int = field(default=0, init=False)
        ''',
        "megatron/training/config/__init__.py": "from megatron.training.config.train import TrainCfg\n",
        "megatron/training/config/train.py": '''
            from dataclasses import dataclass
            @dataclass(kw_only=True)
            class TrainCfg:
                micro_batch_size: int | None = None
                manual_gc: bool = False
        ''',
    }
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))


def test_generator_replays_argparse_and_dataclass_groups(tmp_path):
    src = tmp_path / "Megatron-LM"
    _fake_megatron(src)
    subprocess.run(["git", "init", "-q", str(src)], check=True)
    subprocess.run(["git", "-C", str(src), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(src), "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "x"],
                   check=True)
    out = tmp_path / "flags.json"
    r = subprocess.run([sys.executable, str(REPO / "tools" / "gen_megatron_flags.py"), str(src), "--out", str(out),
                        "--lenient"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    f = doc["flags"]
    assert len(doc["source"]["commit"]) == 40 and doc["source"]["repository"] == "NVIDIA/Megatron-LM"
    assert f["--tp-size"]["group"] == "core" and f["--tp-size"]["source"] == "BaseCfg.tp_size"  # base fields
    assert f["--num-layers"]["default"] is None  # argparse_meta default wins
    assert f["--no-use-bias"]["action"] == "store_false" and f["--disable-use-bias"]["dest"] == "use_bias"
    assert "--use-bias" not in f and f["--fused"]["action"] == "store_true"
    assert f["--backend"]["choices"] == ["flash", "auto"] and f["--backend"]["default"] == "auto"
    assert f["--fmt"]["choices"] == ["e4m3", "hybrid"] and f["--sizes"]["nargs"] == "+"
    assert f["--norm-eps"]["dest"] == "eps" and "--eps" not in f
    assert "--hidden" not in f and "--derived" not in f  # excluded / init=False
    assert f["--no-thing"]["dest"] == "thing" and f["--plain-int"]["default"] == 3
    assert f["--opt"]["stores"] is True and f["--no-opt"]["stores"] is False
    assert f["--only-with-x"]["condition"] == "HAVE_X" and f["--only-with-x"]["choices"] == ["a", "b"]
    assert f["--micro-batch-size"]["group"] == "training" and f["--manual-gc"]["action"] == "store_true"
    assert doc["count"] == len(f) and doc["arguments"] == len({(r["dest"], r["source"]) for r in f.values()})


# ------------------------------------------------------------------------------------------------ the reader
def test_deepseek_v3_proxy_flag_is_recognised_and_listed_once_as_ignored():
    cfg = read_megatron_args(f"{BASE} --no-create-attention-mask-in-dataloader --lr 1e-4 --lr 1e-4 "
                             "--fp8-margin 0 --no-create-attention-mask-in-dataloader")
    assert cfg["_megatron_ignored"] == ["--max-position-embeddings", "--no-create-attention-mask-in-dataloader",
                                        "--lr", "--fp8-margin"]  # in order of appearance, each once
    job = job_from_config(cfg, gpus=4)
    lines = [a for a in job.assumptions if "not modelled" in a]
    assert len(lines) == 1 and "--no-create-attention-mask-in-dataloader" in lines[0] and "--fp8-margin" in lines[0]


@pytest.mark.parametrize("text,closest", [
    ("--no-create-attention-mask-in-dataloder", "--no-create-attention-mask-in-dataloader"),
    ("--num-layer 4", "--num-layers"),
    ("--tensor-model-paralel-size 2", "--tensor-model-parallel-size"),
    ("--overlap-p2p-communication", "--no-overlap-p2p-communication"),  # the positive form does not exist
])
def test_unknown_flag_names_the_closest_real_one(text, closest):
    with pytest.raises(InputError) as e:
        read_megatron_args(f"{BASE} {text}")
    msg = str(e.value)
    assert text.split()[0] in msg and f"closest: {closest}" in msg and "\n" not in msg


def test_negated_forms_and_aliases():
    m = read_megatron_args(f"{BASE} --disable-bias-linear --no-rope-fusion --untie-embeddings-and-output-weights "
                           "--no-bias-swiglu-fusion --swiglu")["model"]
    assert m["add_bias_linear"] is False and m["apply_rope_fusion"] is False
    assert m["share_embeddings_and_output_weights"] is False and m["bias_activation_fusion"] is False
    cfg = read_megatron_args(f"{BASE} --disable-tp-comm-bulk-wgrad --no-rl-training-cuda-graphs "
                             "--override-opt-param-scheduler")
    assert {"--disable-tp-comm-bulk-wgrad", "--no-rl-training-cuda-graphs"} <= set(cfg["_megatron_ignored"])


@pytest.mark.parametrize("extra,needle", [
    ("--bf16=true", "--bf16"),  # store_true takes no value (argparse: ignored explicit argument)
    ("--rampup-batch-size 16 8", "--rampup-batch-size"),  # nargs=3
    ("--moe-token-dispatcher-type bogus", "one of allgather, alltoall, flex"),  # choices
    ("--lr-warmup-init abc", "--lr-warmup-init"),  # float type of an unmodelled flag
    ("--attention-backend nope", "one of flash, fused"),  # Enum choices
    ("--hidden-size 512 stray", "'stray'"),  # a value no flag takes
    ("--hidden-size", "--hidden-size: missing value"),
])
def test_argparse_value_errors(extra, needle):
    with pytest.raises(InputError) as e:
        read_megatron_args(f"{BASE} {extra}")
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_nargs_and_equals_forms():
    m = read_megatron_args(f"{BASE} --cp-comm-type p2p a2a --rampup-batch-size 16 8 300000 "
                           "--recompute-modules=core_attn --seq-length=1024")
    assert m["model"]["cp_comm_type"] == ["p2p", "a2a"] and m["train"]["rampup_batch_size"] == ["16", "8", "300000"]
    assert m["model"]["recompute_modules"] == ["core_attn"] and m["model"]["seq_length"] == 1024


def test_launcher_prefix_comments_and_quotes():
    text = ("CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nproc-per-node 8 pretrain_gpt.py \\\n"
            f"  {BASE} \\\n  # a comment line\n  --data-path '/a b/c' \"/d#e\" --moe-layer-freq '([0]*1+[1]*3)'\n")
    cfg = read_megatron_args(text)
    assert cfg["dataset"]["data_path"] == ["/a b/c", "/d#e"] and cfg["model"]["moe_layer_freq"] == [0, 1, 1, 1]


def test_shell_words_match_shlex_on_ordinary_input():
    text = "--a 1 --b 'x y' --c \"q\\\"r\" --d e\\ f # tail comment\n--g h"
    assert shell_words(text) == shlex.split(text, comments=True)


def test_model_config_yaml_form(tmp_path):
    p = tmp_path / "model_config.yaml"
    p.write_text(textwrap.dedent("""
        ENV_VARS:
          CUDA_DEVICE_MAX_CONNECTIONS: 1
          NVTE_FLAG: true
        MODEL_ARGS:
          --num-layers: 4
          --hidden-size: 512
          --num-attention-heads: 8
          --seq-length: 1024
          --micro-batch-size: 2
          --global-batch-size: 16
          --bf16: true
          --sequence-parallel: false
          --recompute-modules: "[core_attn moe_act]"
          --moe-layer-freq: ([0]*1+[1]*3)
          --num-experts: 4
          --no-create-attention-mask-in-dataloader: true
          --data-cache-path: ""
          --vocab-size: 32000
          --tokenizer-type: NullTokenizer
    """))
    cfg = read_megatron_args(p)
    m = cfg["model"]
    assert m["recompute_modules"] == ["core_attn", "moe_act"] and m["moe_layer_freq"] == [0, 1, 1, 1]
    assert "sequence_parallel" not in m and m["bf16"] is True  # false: the flag is not given
    assert cfg["env_vars"] == {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "NVTE_FLAG": "true"}
    assert cfg["_megatron_ignored"] == ["--no-create-attention-mask-in-dataloader"]


# ------------------------------------------------------------------------------------------------ large inputs
def test_multi_megabyte_argument_file_parses(tmp_path):
    """~2.5 MB on one line (many --data-path values) and a 3 MB single token: parsed, every value kept."""
    n = 110_000
    p = tmp_path / "args.txt"
    # a comment and quotes: the full shell-word scanner, not the plain whitespace split
    p.write_text("# data blend\n" + BASE + " --data-path " + " ".join(f"1.0 '/data/shard_{i:07d}'" for i in range(n))
                 + "\n")
    assert p.stat().st_size > 2 * 2**20
    cfg = read_megatron_args(p)
    paths = cfg["dataset"]["data_path"]
    assert len(paths) == 2 * n and paths[-1] == f"/data/shard_{n - 1:07d}"
    q = tmp_path / "long.txt"
    token = "/" + "x" * (3 * 2**20)
    q.write_text(f"{BASE} --data-cache-path \"{token}\"\n")
    assert read_megatron_args(q)["dataset"]["path_to_cache"] == token


# ------------------------------------------------------------------------------------------------ bad input, CLI
def _one_line_error(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    err = r.stderr.strip()
    assert err.startswith("error:") and "\n" not in err and "Traceback" not in r.stderr, r.stderr
    for n in needles:
        assert n in err, (n, err)


def test_bad_inputs_give_one_line_errors(tmp_path):
    cases = []
    (tmp_path / "quote.txt").write_text(f"{BASE} --data-path 'unterminated\n")
    cases.append(("quote.txt", ["quote.txt", "unterminated"]))
    (tmp_path / "binary.txt").write_bytes(b"--num-layers 4\x00\x01\x02")
    cases.append(("binary.txt", ["binary.txt", "binary"]))
    (tmp_path / "latin1.txt").write_bytes(b"--num-layers 4 --data-path caf\xe9")
    cases.append(("latin1.txt", ["latin1.txt", "UTF-8"]))
    (tmp_path / "adir").mkdir()
    cases.append(("adir", ["adir", "directory"]))
    cases.append(("missing.txt", ["missing.txt", "no such file"]))
    (tmp_path / "unknown.txt").write_text(f"{BASE} --moe-router-top-k 2")
    cases.append(("unknown.txt", ["unknown.txt", "--moe-router-top-k", "closest: --moe-router-topk"]))
    (tmp_path / "neg.txt").write_text(BASE.replace("--hidden-size 512", "--hidden-size -512"))
    cases.append(("neg.txt", ["neg.txt", "--hidden-size", "-512", "positive"]))
    (tmp_path / "zero.txt").write_text(BASE.replace("--micro-batch-size 2", "--micro-batch-size 0"))
    cases.append(("zero.txt", ["zero.txt", "--micro-batch-size", "positive"]))
    (tmp_path / "topk.txt").write_text(BASE.replace("--moe-router-topk 2", "--moe-router-topk 8"))
    cases.append(("topk.txt", ["topk.txt", "--moe-router-topk", "--num-experts=4"]))
    (tmp_path / "empty.txt").write_text("\n# nothing\n")
    cases.append(("empty.txt", ["empty.txt", "no --flags"]))
    (tmp_path / "bad.yaml").write_text("MODEL_ARGS:\n  --num-layers: [4\n")
    cases.append(("bad.yaml", ["bad.yaml", "YAML"]))
    (tmp_path / "nokey.yaml").write_text("MODEL_ARGS:\n  num-layers: 4\n")
    cases.append(("nokey.yaml", ["nokey.yaml", "num-layers"]))
    for name, needles in cases:
        r = run_cli("estimate", "--megatron-args", str(tmp_path / name), "--gpus", "4", "--json")
        _one_line_error(r, *needles)
        assert r.stdout == ""


# ------------------------------------------------------------------------------------------------ every golden config
def _gpus_for(path: Path) -> int:
    """data/README.md section a: functional tests run on 8 GPUs; release tests (launch recipe not in the repo) at
    their smallest valid world size PP*lcm(TP*CP, ETP*EP) (ETP defaults to TP in Megatron-LM)."""
    if "release" not in path.name:
        return 8
    m = read_megatron_args(path)["model"]
    tp, pp = m.get("tensor_model_parallel_size", 1), m.get("pipeline_model_parallel_size", 1)
    cp, ep = m.get("context_parallel_size", 1), m.get("expert_model_parallel_size", 1)
    etp = m.get("expert_tensor_parallel_size") or tp
    from math import lcm

    return pp * lcm(tp * cp, etp * ep)


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name[5:-12] for p in CONFIGS])
def test_every_functional_test_config_estimates(path):
    r = CliRunner().invoke(_app(), ["estimate", "--megatron-args", str(path), "--system", "DGX-H100",
                                    "--gpus", str(_gpus_for(path)), "--json"])
    assert r.exit_code == 0, r.output[-400:]
    d = json.loads(r.stdout)
    assert d["memory"]["stages"] and all(s["peak_allocated_gib"] > 0 for s in d["memory"]["stages"])
    assert d["time"]["step_time_s"] > 0


def test_deepseek_v3_proxy_release_config_estimates_from_the_cli():
    path = DATA / "megatron_golden" / "case_deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release_config.yaml"
    r = run_cli("estimate", "--megatron-args", str(path), "--system", "DGX-H100", "--gpus", str(_gpus_for(path)),
                "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["job"]["layout"]["pipeline_layout"] == "Et*2|(tt|)*5t|tmL"
    assert any("--no-create-attention-mask-in-dataloader" in a for a in d["assumptions"])


def _app():
    from moetune.cli import app

    return app


def _valid_value(rec: dict) -> list[str]:
    """A value argparse would accept for a catalog record (first choice, a number of the type, or a word)."""
    if rec["action"] in ("store_true", "store_false", "BooleanOptionalAction", "store_const", "count"):
        return []
    choices = rec.get("choices")
    if isinstance(choices, list) and choices:
        v = str(choices[0])
    elif rec.get("type") == "float":
        v = "0.5"
    elif rec.get("type") not in (None, "str"):
        v = "1"  # int, and Megatron's parsing callables (moe_freq_type, tuple_type, ...) all take "1"
    else:
        v = "x"
    n = rec.get("nargs")
    return [v] * (n if isinstance(n, int) else 1)


def test_every_catalog_flag_is_accepted():
    """All ~880 option strings of the catalog parse on top of a small job (none is 'unknown')."""
    given = set(BASE.split())
    for option, rec in catalog_flags().items():
        if option in given:
            continue
        cfg = read_megatron_args(f"{BASE} {option} {shlex.join(_valid_value(rec))}")
        assert cfg["model"]["num_layers"] == 4, option


_OPTIONS = sorted(o for o in catalog_flags() if o not in set(BASE.split()))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(_OPTIONS), min_size=1, max_size=12, unique=True),
       st.lists(st.sampled_from(["0", "-1", "abc", "1e9", "true", "", "[1 2]", "'q'"]), min_size=0, max_size=3))
def test_random_flag_combinations_never_crash(options, junk):
    """Any mix of real flags with valid values, plus junk words: a config or a one-line InputError, never a
    traceback of another kind."""
    words = []
    for o in options:
        words += [o, *_valid_value(catalog_flags()[o])]
    words += junk
    try:
        cfg = read_megatron_args(f"{BASE} {shlex.join(words)}")
    except InputError as e:
        assert "\n" not in str(e)
    else:
        assert cfg["frontend"] == "megatron-lm" and len(cfg["_megatron_ignored"]) == len(set(cfg["_megatron_ignored"]))


def test_uneven_pipeline_flags_reach_the_job():
    """--decoder-first/last-pipeline-num-layers and --account-for-*-in-pipeline-split are the Job's pipeline fields
    (TransformerConfig num_layers_in_first/last_pipeline_stage, account_for_*; arguments.py validate_args)."""
    base = BASE.replace("--num-layers 4", "--num-layers 31") + " --pipeline-model-parallel-size 4"
    lay = job_from_config(read_megatron_args(f"{base} --decoder-first-pipeline-num-layers 7 "
                                             "--decoder-last-pipeline-num-layers 8"), gpus=8).layout
    assert (lay.num_layers_in_first_pipeline_stage, lay.num_layers_in_last_pipeline_stage) == (7, 8)
    base30 = base.replace("--num-layers 31", "--num-layers 30")
    lay = job_from_config(read_megatron_args(f"{base30} --account-for-embedding-in-pipeline-split "
                                             "--account-for-loss-in-pipeline-split"), gpus=8).layout
    assert lay.account_for_embedding_in_pipeline_split and lay.account_for_loss_in_pipeline_split
    # validate_args counts the embedding and loss as layers for --num-layers-per-virtual-pipeline-stage too
    m = read_megatron_args(f"{base30} --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split "
                           "--num-layers-per-virtual-pipeline-stage 2")["model"]
    assert m["virtual_pipeline_model_parallel_size"] == 4  # (30 + 2) / 4 / 2
