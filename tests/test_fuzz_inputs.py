"""Malformed and impossible inputs across every command: each gives exit code 2 and exactly one line on stderr
(``error: ...``), no traceback, no internal error and no file left behind; for ``check``, an impossible value is an
error finding with a rule id instead.

The commands run in-process (``moetune.cli.main(argv)`` with stdout/stderr captured, SystemExit caught), so the
~200 cases take seconds; a handful also run as real subprocesses (the console entry point, exit codes, a pipe).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
from pathlib import Path

import pytest

from conftest import run_cli
from moetune.cli import main

REPO = Path(__file__).resolve().parents[1]
LOG = REPO / "data" / "logs" / "log_iteration_1.txt"  # a real Megatron-LM log (iterations 43-45)
PLAN = REPO / "tests" / "fixtures" / "sweep" / "PLAN.json"
CSV_HEADER = "model,system,num_gpus,precision,gbs,mbs,seq_len,tp,pp,cp,vp,ep,model_tflops_per_gpu\n"
CSV_ROW = "Qwen3-30B-A3B,DGX-H100,{gpus},BF16,512,1,4096,1,1,1,n/a,8,{tflops}\n"
RECIPE = "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config"
Q = ["--model", "Qwen3-30B-A3B", "--gpus", "16", "--gbs", "1024", "--seq", "4096"]


def run(argv: list[str]) -> tuple[int, str, str]:
    """``moetune ARGV`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    code: int | None = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    return int(code or 0), out.getvalue(), err.getvalue()


def _model_json(**over) -> dict:
    base = {"name": "fuzz-moe", "num_layers": 4, "hidden_size": 512, "ffn_hidden_size": 0, "num_attention_heads": 8,
            "vocab_size": 1024, "mixer_pattern": "AAAA", "mlp_pattern": "EEEE", "num_moe_experts": 8,
            "moe_router_topk": 2, "moe_ffn_hidden_size": 256}
    base.update(over)
    return base


@pytest.fixture(scope="module")
def d(tmp_path_factory) -> Path:
    """The malformed inputs (one folder, read-only for the tests; outputs go to ``out``)."""
    root = tmp_path_factory.mktemp("fuzz_inputs")
    (root / "empty.txt").write_bytes(b"")
    (root / "empty.json").write_bytes(b"")
    (root / "empty.yaml").write_bytes(b"")
    (root / "empty.csv").write_bytes(b"")
    (root / "binary.bin").write_bytes(bytes(range(256)) * 8)
    (root / "binary.json").write_bytes(b"\xff\xfe\x00{\x00\x01\x80")
    (root / "binary.yaml").write_bytes(b"model:\n  hidden_size: \xff\xfe\n")
    (root / "binary.csv").write_bytes(CSV_HEADER.encode() + b"\xff\xfe\x00\x81\n")
    (root / "utf16.json").write_bytes('{"a": 1}'.encode("utf-16"))
    (root / "nul.txt").write_bytes(b"iteration 1/10 |\x00\x00\x00 elapsed")
    (root / "truncated.json").write_text('{"name": "x", "num_layers": 4, "hidden')
    (root / "truncated.yaml").write_text("model:\n  tensor_model_parallel_size: [1, 2\n")
    (root / "list.json").write_text("[1, 2, 3]")
    (root / "list.yaml").write_text("- 1\n- 2\n")
    (root / "scalar.yaml").write_text("42\n")
    (root / "deep.json").write_text("[" * 100000 + "]" * 100000)
    (root / "noarch.json").write_text('{"foo": 1}')
    (root / "adir").mkdir()
    (root / "adir_with_junk").mkdir()
    (root / "adir_with_junk" / "x.txt").write_text("nothing here")
    (root / "topk.json").write_text(json.dumps(_model_json(moe_router_topk=16)))
    (root / "hidden_neg.json").write_text(json.dumps(_model_json(hidden_size=-512)))
    (root / "experts_zero.json").write_text(json.dumps(_model_json(num_moe_experts=0)))
    (root / "layers_str.json").write_text(json.dumps(_model_json(num_layers="four")))
    (root / "heads_float.json").write_text(json.dumps(_model_json(num_attention_heads=7.5)))
    (root / "unknown_field.json").write_text(json.dumps(_model_json(no_such_field=1)))
    (root / "groups.json").write_text(json.dumps(_model_json(num_query_groups=3)))
    (root / "bridge_unknown_section.yaml").write_text("model: {hidden_size: 512}\nno_such_section: {a: 1}\n")
    (root / "bridge_unknown_field.yaml").write_text("model: {hidden_size: 512, no_such_field: 3}\n")
    (root / "bridge_model_list.yaml").write_text("model: [1, 2]\n")
    (root / "bridge_no_model.yaml").write_text("train: {micro_batch_size: 1}\n")
    (root / "bridge_bad_int.yaml").write_text("model: {tensor_model_parallel_size: abc}\n")
    ok = ("model:\n  num_layers: 4\n  hidden_size: 512\n  num_attention_heads: 8\n  num_moe_experts: 4\n"
          "  moe_router_topk: 2\n  moe_ffn_hidden_size: 128\n  ffn_hidden_size: 1024\n  vocab_size: 1000\n"
          "  seq_length: 512\ntrain:\n  global_batch_size: 16\n  micro_batch_size: 1\n")
    (root / "bridge_ok.yaml").write_text(ok)
    (root / "bridge_topk.yaml").write_text(ok.replace("moe_router_topk: 2", "moe_router_topk: 8"))
    (root / "job_bad.json").write_text(json.dumps({"gpus": -8, "layout": {"tp": 0}}))
    (root / "cc_no_model.json").write_text(json.dumps({"train": {"micro_batch_size": 1}}))
    (root / "csv_neg_gpus.csv").write_text(CSV_HEADER + CSV_ROW.format(gpus=-8, tflops=300))
    (root / "csv_zero_tflops.csv").write_text(CSV_HEADER + CSV_ROW.format(gpus=8, tflops=0))
    (root / "csv_nan_tflops.csv").write_text(CSV_HEADER + CSV_ROW.format(gpus=8, tflops="nan"))
    (root / "csv_frac_tp.csv").write_text(CSV_HEADER + CSV_ROW.format(gpus=8, tflops=300).replace(",1,1,1,", ",1.5,1,1,"))
    (root / "csv_huge_line.csv").write_text(CSV_HEADER + CSV_ROW.format(gpus=8, tflops="9" * (60 * 1024 * 1024)))
    (root / "csv_missing_cols.csv").write_text("model,system\nQwen3-30B-A3B,DGX-H100\n")
    (root / "csv_header_only.csv").write_text(CSV_HEADER)
    (root / "log_no_iterations.txt").write_text("hello\nthis is not a training log\n")
    (root / "trace_truncated.json").write_text('{"traceEvents": [{"name": "x", "ph": "X", "ts": 1')
    (root / "trace_bad.json.gz").write_bytes(b"\x1f\x8b\x08\x00 not really gzip")
    (root / "trace_gz_binary.json.gz").write_bytes(gzip.compress(bytes(range(256))))
    (root / "trace_bad.sqlite").write_bytes(b"SQLite format 3\x00" + b"\x00" * 100)
    (root / "eff_bad.yaml").write_text("params: [1, 2\n")
    (root / "eff_list.yaml").write_text("- 1\n")
    (root / "plan_bad.json").write_text(json.dumps({"candidates": "nope"}))
    (root / "plan_empty.json").write_text(json.dumps({"candidates": []}))
    no_recipe = json.loads(PLAN.read_text())
    for c in no_recipe["candidates"]:
        c.setdefault("launch", {})["recipe"] = None
    (root / "plan_no_recipe.json").write_text(json.dumps(no_recipe))
    (root / "sweep_bad").mkdir()
    (root / "sweep_bad" / "sweep.yaml").write_bytes(b"runs: [\xff\n")
    (root / "sweep_garbage").mkdir()
    (root / "sweep_garbage" / "sweep.yaml").write_text("runs: [1, 2\n")
    (root / "nonempty_out").mkdir()
    (root / "nonempty_out" / "keep.txt").write_text("keep")
    for p in root.rglob("*"):
        if p.is_file():
            p.chmod(0o444)
    return root


def _listing(*roots: Path) -> set[str]:
    return {str(p) for r in roots for p in r.rglob("*")} | {str(p) for r in roots for p in r.parent.glob(".*tmp*")}


#: (id, argv with {d} = inputs folder, {o} = an empty output folder). Every case: exit 2, one stderr line.
CASES: list[tuple[str, list[str]]] = [
    # ---- plan: flags --------------------------------------------------------------------------------------
    ("plan-gpus-zero", ["plan", *Q[:2], "--gpus", "0", "--gbs", "64", "--seq", "4096"]),
    ("plan-gpus-negative", ["plan", *Q[:2], "--gpus", "-8", "--gbs", "64", "--seq", "4096"]),
    ("plan-gpus-text", ["plan", *Q[:2], "--gpus", "many"]),
    ("plan-gpus-float", ["plan", *Q[:2], "--gpus", "1.5"]),
    ("plan-gbs-zero", ["plan", *Q[:4], "--gbs", "0", "--seq", "4096"]),
    ("plan-seq-negative", ["plan", *Q[:6], "--seq", "-4096"]),
    ("plan-precision-unknown", ["plan", *Q, "--precision", "fp7"]),
    ("plan-precision-fp8-on-a100", ["plan", *Q, "--system", "DGX-A100", "--precision", "fp8"]),
    ("plan-precision-nvfp4-on-h100", ["plan", *Q, "--precision", "nvfp4"]),
    ("plan-precision-mxfp8-on-h100", ["plan", *Q, "--precision", "mxfp8"]),
    ("plan-fix-precision-fp8-on-a100", ["plan", *Q, "--system", "DGX-A100", "--fix", "precision=fp8"]),
    ("plan-model-unknown", ["plan", "--model", "GPT-9", "--gpus", "8", "--gbs", "64", "--seq", "4096"]),
    ("plan-model-dir", ["plan", "--model", "{d}/adir", "--gpus", "8", "--gbs", "64", "--seq", "4096"]),
    ("plan-model-missing", ["plan", "--model", "{d}/missing.json", "--gpus", "8", "--gbs", "64", "--seq", "4096"]),
    ("plan-model-binary", ["plan", "--model", "{d}/binary.json", "--gpus", "8", "--gbs", "64", "--seq", "4096"]),
    ("plan-model-empty", ["plan", "--model", "{d}/empty.json", "--gpus", "8", "--gbs", "64", "--seq", "4096"]),
    ("plan-model-truncated", ["plan", "--model", "{d}/truncated.json", "--gpus", "8", "--gbs", "64", "--seq", "4096"]),
    ("plan-model-topk-gt-experts", ["plan", "--model", "{d}/topk.json", "--gpus", "8", "--gbs", "64", "--seq", "4096"]),
    ("plan-model-hidden-negative", ["plan", "--model", "{d}/hidden_neg.json", "--gpus", "8", "--gbs", "64",
                                    "--seq", "4096"]),
    ("plan-system-unknown", ["plan", *Q, "--system", "DGX-Z9000"]),
    ("plan-fix-tp-zero", ["plan", *Q, "--fix", "tp=0"]),
    ("plan-fix-garbage", ["plan", *Q, "--fix", "tp"]),
    ("plan-fix-unknown-key", ["plan", *Q, "--fix", "zz=1"]),
    ("plan-fix-fsdp-bad", ["plan", *Q, "--fix", "fsdp=maybe"]),
    ("plan-mbs-zero", ["plan", *Q, "--mbs", "0"]),
    ("plan-mbs-text", ["plan", *Q, "--mbs", "a,b"]),
    ("plan-dispatchers-unknown", ["plan", *Q, "--dispatchers", "carrier-pigeon"]),
    ("plan-max-recompute-unknown", ["plan", *Q, "--max-recompute", "some"]),
    ("plan-min-headroom-negative", ["plan", *Q, "--min-headroom-gib", "-50"]),
    ("plan-min-headroom-nan", ["plan", *Q, "--min-headroom-gib", "nan"]),
    ("plan-top-zero", ["plan", *Q, "--top", "0"]),
    ("plan-top-negative", ["plan", *Q, "--top", "-3"]),
    ("plan-unknown-option", ["plan", *Q, "--no-such-option"]),
    # ---- estimate: flags ----------------------------------------------------------------------------------
    ("estimate-missing-flags", ["estimate", "--model", "Qwen3-30B-A3B"]),
    ("estimate-gpus-zero", ["estimate", *Q[:2], "--gpus", "0", "--gbs", "64", "--seq", "4096"]),
    ("estimate-mbs-zero", ["estimate", *Q, "--mbs", "0"]),
    ("estimate-tp-negative", ["estimate", *Q, "--tp", "-4"]),
    ("estimate-pp-zero", ["estimate", *Q, "--pp", "0"]),
    ("estimate-ep-not-dividing", ["estimate", *Q, "--ep", "3"]),
    ("estimate-ep-gt-experts", ["estimate", *Q, "--ep", "256", "--gpus", "256"]),
    ("estimate-vpp-without-pp", ["estimate", *Q, "--vpp", "2"]),
    ("estimate-gbs-indivisible", ["estimate", *Q[:4], "--gbs", "1000", "--seq", "4096", "--mbs", "3"]),
    ("estimate-precision-nvfp4-on-h100", ["estimate", *Q, "--ep", "16", "--precision", "nvfp4"]),
    ("estimate-precision-fp8-on-a100", ["estimate", *Q, "--ep", "16", "--system", "DGX-A100", "--precision", "fp8"]),
    ("estimate-precision-unknown", ["estimate", *Q, "--precision", "int3"]),
    ("estimate-cuda-graph-scope-nonsense", ["estimate", *Q, "--ep", "16", "--cuda-graph-scope", "nonsense"]),
    ("estimate-routing-imbalance-nan", ["estimate", *Q, "--ep", "16", "--routing-imbalance", "nan"]),
    ("estimate-routing-imbalance-below-one", ["estimate", *Q, "--ep", "16", "--routing-imbalance", "0.5"]),
    ("estimate-routing-imbalance-inf", ["estimate", *Q, "--ep", "16", "--routing-imbalance", "inf"]),
    ("estimate-optimizer-offload-two", ["estimate", *Q, "--optimizer-offload", "2"]),
    ("estimate-optimizer-offload-nan", ["estimate", *Q, "--optimizer-offload", "nan"]),
    ("estimate-recompute-bogus", ["estimate", *Q, "--recompute", "sometimes"]),
    ("estimate-recompute-full-zero", ["estimate", *Q, "--recompute", "full:uniform:0"]),
    ("estimate-dispatcher-bogus", ["estimate", *Q, "--dispatcher", "fax"]),
    ("estimate-offload-bogus", ["estimate", *Q, "--offload-modules", "everything"]),
    ("estimate-pipeline-layout-garbage", ["estimate", *Q, "--pp", "2", "--pipeline-layout", "(((("]),
    ("estimate-model-topk-json", ["estimate", "--model", "{d}/topk.json", "--gpus", "8", "--gbs", "64", "--seq", "512"]),
    ("estimate-model-experts-zero", ["estimate", "--model", "{d}/experts_zero.json", "--gpus", "8", "--gbs", "64",
                                     "--seq", "512"]),
    ("estimate-model-layers-string", ["estimate", "--model", "{d}/layers_str.json", "--gpus", "8", "--gbs", "64",
                                      "--seq", "512"]),
    ("estimate-model-heads-float", ["estimate", "--model", "{d}/heads_float.json", "--gpus", "8", "--gbs", "64",
                                    "--seq", "512"]),
    ("estimate-model-unknown-field", ["estimate", "--model", "{d}/unknown_field.json", "--gpus", "8", "--gbs", "64",
                                      "--seq", "512"]),
    ("estimate-model-groups-not-dividing", ["estimate", "--model", "{d}/groups.json", "--gpus", "8", "--gbs", "64",
                                            "--seq", "512"]),
    ("estimate-model-list-json", ["estimate", "--model", "{d}/list.json", "--gpus", "8", "--gbs", "64", "--seq", "512"]),
    ("estimate-model-deep-json", ["estimate", "--model", "{d}/deep.json", "--gpus", "8", "--gbs", "64", "--seq", "512"]),
    ("estimate-model-utf16", ["estimate", "--model", "{d}/utf16.json", "--gpus", "8", "--gbs", "64", "--seq", "512"]),
    ("estimate-model-dir-junk", ["estimate", "--model", "{d}/adir_with_junk", "--gpus", "8", "--gbs", "64",
                                 "--seq", "512"]),
    ("estimate-efficiency-missing", ["estimate", *Q, "--ep", "16", "--efficiency", "{d}/missing.yaml"]),
    ("estimate-efficiency-binary", ["estimate", *Q, "--ep", "16", "--efficiency", "{d}/binary.yaml"]),
    ("estimate-efficiency-dir", ["estimate", *Q, "--ep", "16", "--efficiency", "{d}/adir"]),
    ("estimate-efficiency-bad-yaml", ["estimate", *Q, "--ep", "16", "--efficiency", "{d}/eff_bad.yaml"]),
    ("estimate-efficiency-list", ["estimate", *Q, "--ep", "16", "--efficiency", "{d}/eff_list.yaml"]),
    # ---- estimate: Bridge YAML and overrides, Megatron args ----------------------------------------------------
    ("estimate-bridge-missing", ["estimate", "--bridge-config", "{d}/missing.yaml", "--gpus", "8"]),
    ("estimate-bridge-dir", ["estimate", "--bridge-config", "{d}/adir", "--gpus", "8"]),
    ("estimate-bridge-empty", ["estimate", "--bridge-config", "{d}/empty.yaml", "--gpus", "8"]),
    ("estimate-bridge-binary", ["estimate", "--bridge-config", "{d}/binary.yaml", "--gpus", "8"]),
    ("estimate-bridge-truncated", ["estimate", "--bridge-config", "{d}/truncated.yaml", "--gpus", "8"]),
    ("estimate-bridge-list", ["estimate", "--bridge-config", "{d}/list.yaml", "--gpus", "8"]),
    ("estimate-bridge-scalar", ["estimate", "--bridge-config", "{d}/scalar.yaml", "--gpus", "8"]),
    ("estimate-bridge-unknown-section", ["estimate", "--bridge-config", "{d}/bridge_unknown_section.yaml"]),
    ("estimate-bridge-unknown-field", ["estimate", "--bridge-config", "{d}/bridge_unknown_field.yaml"]),
    ("estimate-bridge-model-list", ["estimate", "--bridge-config", "{d}/bridge_model_list.yaml"]),
    ("estimate-bridge-no-model", ["estimate", "--bridge-config", "{d}/bridge_no_model.yaml"]),
    ("estimate-bridge-bad-int", ["estimate", "--bridge-config", "{d}/bridge_bad_int.yaml"]),
    ("estimate-bridge-override-unknown", ["estimate", "--bridge-config", "{d}/bridge_no_model.yaml",
                                          "model.no_such_field=1"]),
    ("estimate-bridge-topk-gt-experts", ["estimate", "--bridge-config", "{d}/bridge_topk.yaml", "--gpus", "8"]),
    ("estimate-bridge-mbs-zero", ["estimate", "--bridge-config", "{d}/bridge_ok.yaml", "--gpus", "8",
                                  "train.micro_batch_size=0"]),
    ("estimate-bridge-hidden-negative", ["estimate", "--bridge-config", "{d}/bridge_ok.yaml", "--gpus", "8",
                                         "model.hidden_size=-512"]),
    ("estimate-bridge-tp-negative", ["estimate", "--bridge-config", "{d}/bridge_ok.yaml", "--gpus", "8",
                                     "model.tensor_model_parallel_size=-4"]),
    ("estimate-bridge-precision-nvfp4-h100", ["estimate", "--bridge-config", "{d}/bridge_ok.yaml", "--gpus", "8",
                                              "--system", "DGX-H100", "mixed_precision=bf16_with_nvfp4_mixed"]),
    ("estimate-recipe-override-unknown", ["estimate", "--recipe", RECIPE, "model.no_such_field=1"]),
    ("estimate-recipe-override-mbs-zero", ["estimate", "--recipe", RECIPE, "train.micro_batch_size=0"]),
    ("estimate-recipe-override-not-int", ["estimate", "--recipe", RECIPE, "model.tensor_model_parallel_size=x"]),
    ("estimate-recipe-unknown", ["estimate", "--recipe", "no_such_recipe"]),
    ("estimate-bridge-with-megatron", ["estimate", "--bridge-config", "{d}/empty.yaml", "--megatron-args",
                                       "{d}/empty.txt"]),
    ("estimate-megatron-missing", ["estimate", "--megatron-args", "{d}/missing.txt", "--gpus", "8"]),
    ("estimate-megatron-dir", ["estimate", "--megatron-args", "{d}/adir", "--gpus", "8"]),
    ("estimate-megatron-binary", ["estimate", "--megatron-args", "{d}/binary.bin", "--gpus", "8"]),
    ("estimate-megatron-empty", ["estimate", "--megatron-args", "{d}/empty.txt", "--gpus", "8"]),
    ("estimate-megatron-overrides", ["estimate", "--megatron-args", "{d}/empty.txt", "model.x=1"]),
    # ---- check -----------------------------------------------------------------------------------------------
    ("check-nothing", ["check"]),
    ("check-missing", ["check", "{d}/missing.yaml"]),
    ("check-dir", ["check", "{d}/adir"]),
    ("check-empty", ["check", "{d}/empty.yaml"]),
    ("check-empty-txt", ["check", "{d}/empty.txt"]),
    ("check-binary", ["check", "{d}/binary.yaml"]),
    ("check-binary-bin", ["check", "{d}/binary.bin"]),
    ("check-truncated-yaml", ["check", "{d}/truncated.yaml"]),
    ("check-truncated-json", ["check", "{d}/truncated.json"]),
    ("check-list-json", ["check", "{d}/list.json"]),
    ("check-list-yaml", ["check", "{d}/list.yaml"]),
    ("check-utf16", ["check", "{d}/utf16.json"]),
    ("check-job-json-bad", ["check", "{d}/job_bad.json"]),
    ("check-cc-json-no-model", ["check", "{d}/cc_no_model.json"]),
    ("check-unknown-section", ["check", "{d}/bridge_unknown_section.yaml"]),
    ("check-unknown-field", ["check", "{d}/bridge_unknown_field.yaml"]),
    ("check-bad-int", ["check", "{d}/bridge_bad_int.yaml"]),
    ("check-recipe-unknown", ["check", "--recipe", "no_such_recipe"]),
    ("check-recipe-and-file", ["check", "{d}/empty.yaml", "--recipe", RECIPE]),
    ("check-override-unknown-field", ["check", "--recipe", RECIPE, "model.no_such_field=1"]),
    ("check-override-typo-field", ["check", "--recipe", RECIPE, "model.hiden_size=1024"]),
    ("check-override-unknown-section", ["check", "--recipe", RECIPE, "modle.hidden_size=1024"]),
    ("check-override-bad-key", ["check", "--recipe", RECIPE, "model..x=1"]),
    ("check-override-not-int", ["check", "--recipe", RECIPE, "model.tensor_model_parallel_size=abc"]),
    ("check-override-fractional-size", ["check", "--recipe", RECIPE, "model.seq_length=2.5"]),
    ("check-override-section-scalar", ["check", "--recipe", RECIPE, "model.tensor_model_parallel_size.x=1"]),
    ("check-gpus-zero", ["check", "--recipe", RECIPE, "--gpus", "0"]),
    ("check-system-unknown", ["check", "--recipe", RECIPE, "--system", "TPU-v9"]),
    ("check-env-bad", ["check", "--recipe", RECIPE, "--env", "NOEQUALS"]),
    ("check-two-files", ["check", "{d}/bridge_no_model.yaml", "{d}/bridge_unknown_field.yaml"]),
    ("check-megatron-binary", ["check", "--megatron-args", "{d}/binary.bin"]),
    ("check-megatron-dir", ["check", "--megatron-args", "{d}/adir"]),
    # ---- logs / diagnose / compare -------------------------------------------------------------------------
    ("logs-missing", ["logs", "{d}/missing.log"]),
    ("logs-dir", ["logs", "{d}/adir"]),
    ("logs-empty", ["logs", "{d}/empty.txt"]),
    ("logs-binary", ["logs", "{d}/binary.bin"]),
    ("logs-nul", ["logs", "{d}/nul.txt"]),
    ("logs-not-a-log", ["logs", "{d}/log_no_iterations.txt"]),
    ("logs-window-outside", ["logs", str(LOG), "--window", "500-600"]),
    ("logs-window-reversed", ["logs", str(LOG), "--window", "50-40"]),
    ("logs-window-text", ["logs", str(LOG), "--window", "start-end"]),
    ("logs-window-json", ["logs", str(LOG), "--window", "500-600", "--json"]),
    ("logs-gpus-zero", ["logs", str(LOG), "--gpus", "0"]),
    ("diagnose-missing", ["diagnose", "{d}/missing.log"]),
    ("diagnose-dir", ["diagnose", "{d}/adir"]),
    ("diagnose-empty", ["diagnose", "{d}/empty.txt"]),
    ("diagnose-binary", ["diagnose", "{d}/binary.bin"]),
    ("compare-missing", ["compare", "{d}/missing.log", str(LOG)]),
    ("compare-dir", ["compare", str(LOG), "{d}/adir"]),
    ("compare-binary", ["compare", "{d}/binary.bin", str(LOG)]),
    ("compare-empty", ["compare", str(LOG), "{d}/empty.txt"]),
    ("compare-window-outside", ["compare", str(LOG), str(LOG), "--window", "500-600"]),
    ("compare-window-a-bad", ["compare", str(LOG), str(LOG), "--window-a", "x-y"]),
    ("compare-gpus-zero", ["compare", str(LOG), str(LOG), "--gpus", "0"]),
    ("compare-one-arg", ["compare", str(LOG)]),
    # ---- trace ---------------------------------------------------------------------------------------------
    ("trace-missing", ["trace", "{d}/missing.json"]),
    ("trace-dir-empty", ["trace", "{d}/adir"]),
    ("trace-empty", ["trace", "{d}/empty.json"]),
    ("trace-binary", ["trace", "{d}/binary.json"]),
    ("trace-truncated", ["trace", "{d}/trace_truncated.json"]),
    ("trace-bad-gzip", ["trace", "{d}/trace_bad.json.gz"]),
    ("trace-gzip-binary", ["trace", "{d}/trace_gz_binary.json.gz"]),
    ("trace-bad-sqlite", ["trace", "{d}/trace_bad.sqlite"]),
    ("trace-text-file", ["trace", "{d}/empty.txt"]),
    ("trace-taxonomy-missing", ["trace", str(REPO / "data" / "traces" / "deepseek_profile_data_train.json"),
                                "--taxonomy", "{d}/missing.yaml"]),
    ("trace-taxonomy-binary", ["trace", str(REPO / "data" / "traces" / "deepseek_profile_data_train.json"),
                               "--taxonomy", "{d}/binary.yaml"]),
    ("trace-diff-missing", ["trace", "diff", "{d}/missing.json", "{d}/missing2.json"]),
    ("trace-diff-binary", ["trace", "diff", "{d}/binary.json", "{d}/binary.json"]),
    # ---- sweep -----------------------------------------------------------------------------------------------
    ("sweep-init-recipe-unknown", ["sweep", "init", "--from-plan", str(PLAN), "--out", "{o}/s", "--recipe",
                                   "no_such_recipe"]),
    ("sweep-init-plan-missing", ["sweep", "init", "--from-plan", "{d}/missing.json", "--out", "{o}/s"]),
    ("sweep-init-plan-binary", ["sweep", "init", "--from-plan", "{d}/binary.json", "--out", "{o}/s"]),
    ("sweep-init-plan-empty", ["sweep", "init", "--from-plan", "{d}/empty.json", "--out", "{o}/s"]),
    ("sweep-init-plan-dir", ["sweep", "init", "--from-plan", "{d}/adir", "--out", "{o}/s"]),
    ("sweep-init-plan-truncated", ["sweep", "init", "--from-plan", "{d}/truncated.json", "--out", "{o}/s"]),
    ("sweep-init-plan-bad", ["sweep", "init", "--from-plan", "{d}/plan_bad.json", "--out", "{o}/s"]),
    ("sweep-init-plan-no-candidates", ["sweep", "init", "--from-plan", "{d}/plan_empty.json", "--out", "{o}/s"]),
    ("sweep-init-no-recipe-known", ["sweep", "init", "--from-plan", "{d}/plan_no_recipe.json", "--out", "{o}/s"]),
    ("sweep-init-candidate-out-of-range", ["sweep", "init", "--from-plan", str(PLAN), "--out", "{o}/s",
                                           "--candidate", "99"]),
    ("sweep-init-framework-unknown", ["sweep", "init", "--from-plan", str(PLAN), "--out", "{o}/s", "--framework",
                                      "jax"]),
    ("sweep-init-entry-unknown", ["sweep", "init", "--from-plan", str(PLAN), "--out", "{o}/s", "--entry", "main"]),
    ("sweep-init-profiler-unknown", ["sweep", "init", "--from-plan", str(PLAN), "--out", "{o}/s", "--profiler",
                                     "perf"]),
    ("sweep-init-out-nonempty", ["sweep", "init", "--from-plan", str(PLAN), "--out", "{d}/nonempty_out"]),
    ("sweep-init-out-is-file", ["sweep", "init", "--from-plan", str(PLAN), "--out", "{d}/empty.txt"]),
    ("sweep-init-both-sources", ["sweep", "init", "--from-plan", str(PLAN), "--baseline", "{d}/empty.yaml",
                                 "--out", "{o}/s"]),
    ("sweep-init-no-source", ["sweep", "init", "--out", "{o}/s"]),
    ("sweep-status-missing", ["sweep", "status", "{d}/missing_dir"]),
    ("sweep-status-not-sweep", ["sweep", "status", "{d}/adir"]),
    ("sweep-status-file", ["sweep", "status", "{d}/empty.txt"]),
    ("sweep-collect-missing", ["sweep", "collect", "{d}/missing_dir"]),
    ("sweep-collect-not-sweep", ["sweep", "collect", "{d}/adir"]),
    ("sweep-collect-binary-yaml", ["sweep", "collect", "{d}/sweep_bad"]),
    ("sweep-collect-garbage-yaml", ["sweep", "collect", "{d}/sweep_garbage"]),
    ("sweep-submit-not-sweep", ["sweep", "submit", "{d}/adir"]),
    # ---- report ----------------------------------------------------------------------------------------------
    ("report-missing", ["report", "{d}/missing.json"]),
    ("report-dir", ["report", "{d}/adir"]),
    ("report-binary", ["report", "{d}/binary.json"]),
    ("report-empty", ["report", "{d}/empty.json"]),
    ("report-truncated", ["report", "{d}/truncated.json"]),
    ("report-md-folder-missing", ["report", str(PLAN), "--html", "{o}/r.html", "--md", "{o}/nonexistent/x.md"]),
    ("report-html-is-dir", ["report", str(PLAN), "--html", "{o}", "--md", "{o}/r.md"]),
    ("report-same-target", ["report", str(PLAN), "--html", "{o}/r.x", "--md", "{o}/r.x"]),
    # ---- catalog / model show --------------------------------------------------------------------------------
    ("catalog-unknown-sub", ["catalog", "gpus"]),
    ("catalog-models-bad-option", ["catalog", "models", "--wide"]),
    ("model-show-unknown", ["model", "show", "GPT-9"]),
    ("model-show-dir", ["model", "show", "{d}/adir"]),
    ("model-show-missing", ["model", "show", "{d}/missing.json"]),
    ("model-show-binary", ["model", "show", "{d}/binary.json"]),
    ("model-show-empty", ["model", "show", "{d}/empty.json"]),
    ("model-show-truncated", ["model", "show", "{d}/truncated.json"]),
    ("model-show-list", ["model", "show", "{d}/list.json"]),
    ("model-show-noarch", ["model", "show", "{d}/noarch.json"]),
    ("model-show-topk", ["model", "show", "{d}/topk.json"]),
    ("model-show-hidden-negative", ["model", "show", "{d}/hidden_neg.json"]),
    ("model-show-layers-string", ["model", "show", "{d}/layers_str.json"]),
    ("model-show-unknown-field", ["model", "show", "{d}/unknown_field.json"]),
    ("model-show-nul-name", ["model", "show", "bad\x00name"]),
    ("model-show-long-name", ["model", "show", "x" * 5000]),
    # ---- layout / flops --------------------------------------------------------------------------------------
    ("layout-no-gpus", ["layout", "--tp", "2"]),
    ("layout-gpus-zero", ["layout", "--gpus", "0"]),
    ("layout-tp-negative", ["layout", "--gpus", "8", "--tp", "-2"]),
    ("layout-not-dividing", ["layout", "--gpus", "8", "--tp", "3"]),
    ("layout-vpp-without-pp", ["layout", "--gpus", "8", "--vpp", "2"]),
    ("layout-system-unknown", ["layout", "--gpus", "8", "--system", "Cray-1"]),
    ("layout-model-unknown", ["layout", "--gpus", "8", "--model", "GPT-9"]),
    ("layout-model-dir", ["layout", "--gpus", "8", "--model", "{d}/adir"]),
    ("layout-pipeline-layout-garbage", ["layout", "--gpus", "8", "--pp", "2", "--pipeline-layout", "?!"]),
    ("layout-mbs-zero", ["layout", "--gpus", "8", "--gbs", "64", "--mbs", "0"]),
    ("layout-ranks-per-domain-zero", ["layout", "--gpus", "8", "--ranks-per-domain", "0"]),
    ("flops-no-seq", ["flops", "--model", "Qwen3-30B-A3B"]),
    ("flops-seq-zero", ["flops", "--model", "Qwen3-30B-A3B", "--seq", "0"]),
    ("flops-seq-negative", ["flops", "--model", "Qwen3-30B-A3B", "--seq", "-1"]),
    ("flops-gbs-zero", ["flops", "--model", "Qwen3-30B-A3B", "--seq", "4096", "--gbs", "0"]),
    ("flops-tp-zero", ["flops", "--model", "Qwen3-30B-A3B", "--seq", "4096", "--tp", "0"]),
    ("flops-definition-unknown", ["flops", "--model", "Qwen3-30B-A3B", "--seq", "4096", "--definition", "new"]),
    ("flops-model-unknown", ["flops", "--model", "GPT-9", "--seq", "4096"]),
    ("flops-model-binary", ["flops", "--model", "{d}/binary.json", "--seq", "4096"]),
    ("flops-model-topk", ["flops", "--model", "{d}/topk.json", "--seq", "4096"]),
    # ---- calibrate -------------------------------------------------------------------------------------------
    ("calibrate-missing", ["calibrate", "{d}/missing.csv"]),
    ("calibrate-dir", ["calibrate", "{d}/adir"]),
    ("calibrate-empty", ["calibrate", "{d}/empty.csv"]),
    ("calibrate-binary", ["calibrate", "{d}/binary.csv"]),
    ("calibrate-binary-bin", ["calibrate", "{d}/binary.bin"]),
    ("calibrate-negative-gpus", ["calibrate", "{d}/csv_neg_gpus.csv"]),
    ("calibrate-zero-tflops", ["calibrate", "{d}/csv_zero_tflops.csv"]),
    ("calibrate-nan-tflops", ["calibrate", "{d}/csv_nan_tflops.csv"]),
    ("calibrate-fractional-tp", ["calibrate", "{d}/csv_frac_tp.csv"]),
    ("calibrate-60mb-line", ["calibrate", "{d}/csv_huge_line.csv"]),
    ("calibrate-missing-columns", ["calibrate", "{d}/csv_missing_cols.csv"]),
    ("calibrate-header-only", ["calibrate", "{d}/csv_header_only.csv"]),
    ("calibrate-params-unknown", ["calibrate", "{d}/csv_header_only.csv", "--params", "warp_speed"]),
    ("calibrate-max-evals-zero", ["calibrate", "{d}/csv_header_only.csv", "--max-evals", "0"]),
    ("calibrate-out-folder-missing", ["calibrate", "{d}/csv_header_only.csv", "--out", "{o}/no/such/eff.yaml"]),
    ("calibrate-efficiency-binary", ["calibrate", "{d}/csv_header_only.csv", "--efficiency", "{d}/binary.yaml"]),
    # ---- the root command ----------------------------------------------------------------------------------
    ("unknown-command", ["frobnicate"]),
    ("version-bad-option", ["version", "--yaml"]),
]


@pytest.mark.parametrize("case_id,argv", CASES, ids=[c[0] for c in CASES])
def test_malformed_input_gives_one_line_and_exit_2(case_id, argv, d, tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    args = [a.replace("{d}", str(d)).replace("{o}", str(out_dir)) for a in argv]
    before = _listing(d, out_dir)
    code, stdout, stderr = run(args)
    lines = stderr.splitlines()
    assert code == 2, (case_id, code, stderr[-600:], stdout[-300:])
    assert len(lines) == 1 and lines[0].startswith("error: "), (case_id, stderr[-800:])
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr
    assert "errors.pydantic.dev" not in stderr and "validation error for" not in stderr, stderr
    assert "[Errno" not in stderr and "codec can't decode" not in stderr, stderr
    assert _listing(d, out_dir) == before, f"{case_id} left files behind"


def test_there_are_at_least_150_cases():
    assert len(CASES) >= 150
    assert len({c[0] for c in CASES}) == len(CASES)
    commands = {c[1][0] for c in CASES}
    assert {"plan", "estimate", "check", "logs", "diagnose", "compare", "trace", "sweep", "report", "catalog",
            "model", "layout", "flops", "calibrate"} <= commands


#: impossible values a config may hold: ``check`` reports each as an error finding (rule id, field, value), exit 1
IMPOSSIBLE = [
    ("model.hidden_size=-512", "VAL-008", "model.hidden_size"),
    ("train.micro_batch_size=0", "VAL-023", "train.micro_batch_size"),
    ("model.tensor_model_parallel_size=-4", "VAL-001", "model.tensor_model_parallel_size"),
    ("model.pipeline_model_parallel_size=0", "VAL-002", "model.pipeline_model_parallel_size"),
    ("model.expert_model_parallel_size=-16", "VAL-004", "model.expert_model_parallel_size"),
    ("model.num_moe_experts=0", "VAL-014", "model.num_moe_experts"),
    ("model.num_layers=0", "VAL-007", "model.num_layers"),
    ("train.global_batch_size=-1", "VAL-024", "train.global_batch_size"),
    ("model.moe_router_topk=500", "MOE-021", "model.moe_router_topk"),
    ("model.seq_length=-4096", "VAL-013", "model.seq_length"),
]


@pytest.mark.parametrize("override,rule_id,field", IMPOSSIBLE, ids=[x[1] + ":" + x[0] for x in IMPOSSIBLE])
def test_check_reports_impossible_values_as_error_findings(override, rule_id, field):
    code, stdout, stderr = run(["check", "--recipe", RECIPE, override, "--json"])
    assert code == 1, (code, stderr)
    assert "Traceback" not in stderr and "internal error" not in stderr
    doc = json.loads(stdout)
    hits = [f for f in doc["findings"] if f["id"] == rule_id]
    assert hits and hits[0]["severity"].startswith("error"), [f["id"] for f in doc["findings"]]
    assert field in hits[0]["message"] and override.split("=")[1] in hits[0]["message"]


def test_check_human_output_shows_negative_tp_as_a_value():
    code, stdout, _ = run(["check", "--recipe", RECIPE, "model.tensor_model_parallel_size=-4"])
    assert code == 1
    assert "TP=-4" in stdout and "TP-4" not in stdout and "VPPNone" not in stdout


def test_check_json_with_unknown_world_size_serialises():
    """A layout override after which the world size is unknown (no --gpus): every result type serialises."""
    code, stdout, stderr = run(["check", "--recipe", "deepseek_v3_pretrain_256gpu_b200_nvfp4_config",
                                "model.tensor_model_parallel_size=3", "--json"])
    assert code in (0, 1), stderr
    doc = json.loads(stdout)
    assert "not JSON serializable" not in stderr and doc["findings"]
    from moetune.output import to_json_bytes
    from moetune.rules.engine import UNKNOWN

    assert json.loads(to_json_bytes({"dp": UNKNOWN, "n": 2**80})) == {"dp": None, "n": float(2**80)}


def test_report_leaves_nothing_when_one_target_fails(tmp_path):
    html = tmp_path / "r.html"
    code, _, stderr = run(["report", str(PLAN), "--html", str(html), "--md", "/nonexistent/x.md"])
    assert code == 2 and "/nonexistent" in stderr
    assert not html.exists() and list(tmp_path.iterdir()) == []


def test_sweep_init_with_unknown_recipe_writes_nothing(tmp_path):
    code, _, stderr = run(["sweep", "init", "--from-plan", str(PLAN), "--out", str(tmp_path / "s"),
                           "--recipe", "no_such_recipe"])
    assert code == 2 and "no_such_recipe" in stderr
    assert list(tmp_path.iterdir()) == []


def test_sweep_collect_on_unsubmitted_sweep_marks_runs_pending(tmp_path):
    d = tmp_path / "s"
    assert run(["sweep", "init", "--from-plan", str(PLAN), "--out", str(d)])[0] == 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # the hidden build folder is gone
    code, stdout, _ = run(["sweep", "collect", str(d), "--json"])
    assert code == 0
    doc = json.loads(stdout)
    assert doc["runs"] and all(r["status"] == "pending" for r in doc["runs"])
    assert doc["rejected"] == 0 and doc["pending"] == len(doc["runs"])
    code, stdout, _ = run(["sweep", "collect", str(d)])
    assert "pending" in stdout and "rejected" not in stdout


def test_logs_window_inside_the_log_still_works():
    code, stdout, _ = run(["logs", str(LOG), "--window", "43-45", "--json"])
    assert code == 0 and json.loads(stdout)


def test_version_flag_and_json():
    from moetune import __version__

    code, stdout, _ = run(["--version"])
    assert code == 0 and stdout.strip() == __version__
    code, stdout, _ = run(["version", "--json"])
    assert code == 0 and json.loads(stdout)["moetune"] == __version__


# ---- real subprocesses: the console entry point, exit codes and a pipe -------------------------------------------
SUBPROCESS_CASES = [
    ["plan", "--model", "Qwen3-30B-A3B", "--system", "DGX-A100", "--gpus", "16", "--gbs", "1024", "--seq", "4096",
     "--precision", "fp8"],
    ["estimate", *Q, "--cuda-graph-scope", "nonsense"],
    ["check", "--recipe", RECIPE, "model.no_such_field=1"],
    ["logs", str(LOG), "--window", "500-600"],
    ["model", "show", str(REPO / "data")],
]


@pytest.mark.parametrize("argv", SUBPROCESS_CASES, ids=[a[0] for a in SUBPROCESS_CASES])
def test_subprocess_one_line_exit_2(argv):
    r = run_cli(*argv)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("error: "), r.stderr
    assert r.stdout == ""


def test_piped_copyable_lines_are_not_wrapped():
    """Piped output (not a terminal): a long override line stays one line; tables fit in 100 columns."""
    r = run_cli("check", "--recipe", RECIPE, "model.expert_model_parallel_size=7", "--gpus", "16", "--fix")
    assert r.returncode in (0, 1), r.stderr
    lines = r.stdout.splitlines()
    fixes = [ln for ln in lines if ln.strip().startswith("fix:")]
    assert fixes, r.stdout[-2000:]
    for ln in fixes:  # a fix line is key=value pairs, never broken onto the next line
        assert all("=" in tok for tok in ln.split()[1:]), ln
    r = run_cli("catalog", "models")
    assert all(len(ln) <= 100 for ln in r.stdout.splitlines())
    assert "…" not in r.stdout and "Llama-4-Maverick" in r.stdout


def test_progress_goes_to_stderr_only_on_a_terminal():
    from moetune import progress
    from moetune.output import progress_on_stderr

    class FakeTTY(io.StringIO):
        def isatty(self) -> bool:
            return True

    seen = []
    with progress.reporting(lambda done, total, what: seen.append((done, total, what))):
        progress.report(1, 4, "layouts")
    progress.report(2, 4, "layouts")  # nothing installed: ignored
    assert seen == [(1, 4, "layouts")]
    tty, pipe = FakeTTY(), io.StringIO()
    old = progress.SHOW_AFTER_S
    progress.SHOW_AFTER_S = 0.0
    try:
        with progress_on_stderr("planning", stream=tty):
            progress.report(3, 10, "layouts")
        with progress_on_stderr("planning", stream=pipe):
            progress.report(3, 10, "layouts")
    finally:
        progress.SHOW_AFTER_S = old
    assert "planning" in tty.getvalue() and pipe.getvalue() == ""


def test_the_planner_reports_progress():
    from moetune import progress
    from moetune.catalog.models import get_model
    from moetune.catalog.systems import get_system
    from moetune.plan.search import PlanRequest, plan

    seen = []
    with progress.reporting(lambda done, total, what: seen.append((done, total))):
        res = plan(PlanRequest(model=get_model("OLMoE-1B-7B"), system=get_system("DGX-H100"), gpus=8,
                               global_batch_size=256, seq_length=4096, top=2))
    assert res.candidates and seen
    assert all(0 <= d <= t for d, t in seen) and len({t for _, t in seen}) == 1
