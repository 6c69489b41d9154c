"""Bad Hugging Face input: one line naming the file, the field, the value and what was expected; exit 2.

Each case writes a real Qwen3-30B-A3B / DeepSeek-V3 ``config.json`` from the repo's data with one field broken and
runs ``moetune flops --model PATH`` in-process (``moetune.cli.main``) and, for a few, in a subprocess (the real exit
code, no traceback). A property test mutates random fields of real configs: the reader returns a model or raises
:class:`InputError`, never anything else.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import DATA, run_cli
from moetune.catalog.hf import model_from_hf_config, model_from_hf_dict
from moetune.cli import main
from moetune.errors import InputError
from moetune.perfmodel.params import count_params

QWEN = json.loads((DATA / "models" / "hf_qwen3-30b-a3b.json").read_text())
DSV3 = json.loads((DATA / "models" / "hf_deepseek-v3.json").read_text())


def _cli(capsys, *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    return exc.value.code, capsys.readouterr().err


def _write(tmp_path: Path, data, name: str = "config.json") -> Path:
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return p


# (case id, base config, field, bad value, words the one-line message must hold)
FIELD_CASES = [
    ("layers-string", QWEN, "num_hidden_layers", "48", ["num_hidden_layers='48'", "an integer"]),
    ("layers-float", QWEN, "num_hidden_layers", 48.5, ["num_hidden_layers=48.5", "an integer"]),
    ("layers-1e12", QWEN, "num_hidden_layers", 10**12, ["num_hidden_layers=1000000000000", "[1, 4096]"]),
    ("layers-bool", QWEN, "num_hidden_layers", True, ["num_hidden_layers=True", "an integer"]),
    ("layers-zero", QWEN, "num_hidden_layers", 0, ["num_hidden_layers=0", "[1, 4096]"]),
    ("hidden-negative", QWEN, "hidden_size", -512, ["hidden_size=-512", "an integer in [1,"]),
    ("hidden-zero", QWEN, "hidden_size", 0, ["hidden_size=0"]),
    ("vocab-negative", QWEN, "vocab_size", -1, ["vocab_size=-1"]),
    ("heads-string", QWEN, "num_attention_heads", "32", ["num_attention_heads='32'"]),
    ("kv-heads-not-divisor", QWEN, "num_key_value_heads", 5, ["num_key_value_heads=5", "a divisor of"]),
    ("experts-negative", QWEN, "num_experts", -8, ["num_experts=-8"]),
    ("topk-above-experts", QWEN, "num_experts_per_tok", 200, ["num_experts_per_tok=200", "at most", "(128)"]),
    ("moe-width-float", QWEN, "moe_intermediate_size", 768.5, ["moe_intermediate_size=768.5"]),
    ("sparse-step-zero", QWEN, "decoder_sparse_step", 0, ["decoder_sparse_step=0"]),
    ("mlp-only-not-list", QWEN, "mlp_only_layers", "0,1", ["mlp_only_layers='0,1'", "a list of integers"]),
    ("mlp-only-strings", QWEN, "mlp_only_layers", ["a"], ["mlp_only_layers[0]='a'"]),
    ("layer-types-length", QWEN, "layer_types", ["full_attention"] * 3, ["layer_types='3 entries'", "48 entries"]),
    ("layer-types-unknown", QWEN, "layer_types", ["cross_attention"] * 48, ["layer_types='cross_attention'"]),
    ("tie-not-bool", QWEN, "tie_word_embeddings", "yes", ["tie_word_embeddings='yes'", "true or false"]),
    ("dsv3-topk-above-experts", DSV3, "num_experts_per_tok", 512, ["num_experts_per_tok=512", "(256)"]),
    ("dsv3-first-k-negative", DSV3, "first_k_dense_replace", -1, ["first_k_dense_replace=-1"]),
    ("dsv3-kv-lora-zero", DSV3, "kv_lora_rank", 0, ["kv_lora_rank=0"]),
    ("model-type-unknown", QWEN, "model_type", "bert", ["unsupported model_type='bert'", "expected one of"]),
    ("missing-required", QWEN, "vocab_size", None, ["required field 'vocab_size'"]),
]


@pytest.mark.parametrize("case,base,field,value,words", FIELD_CASES, ids=[c[0] for c in FIELD_CASES])
def test_bad_field_is_one_line_error(tmp_path, capsys, case, base, field, value, words):
    data = dict(base)
    data.pop("architectures", None)  # model_type alone decides the family
    data[field] = value
    p = _write(tmp_path, data)
    code, err = _cli(capsys, "flops", "--model", str(p), "--seq", "4096")
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert str(p) in lines[0] and "Traceback" not in err
    for w in words:
        assert w in lines[0], (w, lines[0])


FILE_CASES = [
    ("malformed-json", '{"model_type": "qwen3_moe",', "malformed JSON at line 1"),
    ("empty-file", "", "malformed JSON"),
    ("json-array", "[1, 2, 3]", "expected a JSON object"),
    ("json-string", '"config"', "expected a JSON object"),
    ("deep-nesting", "[" * 100000 + "]" * 100000, "nested too deeply"),
]


@pytest.mark.parametrize("case,text,words", FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_bad_file_is_one_line_error(tmp_path, capsys, case, text, words):
    p = _write(tmp_path, text)
    code, err = _cli(capsys, "flops", "--model", str(p), "--seq", "4096")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert str(p) in err and words in err


def test_binary_and_non_utf8_files(tmp_path, capsys):
    p = tmp_path / "config.json"
    p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    code, err = _cli(capsys, "flops", "--model", str(p), "--seq", "4096")
    assert code == 2 and "binary file" in err and str(p) in err
    p.write_bytes(b'{"model_type": "qwen3_moe\xff"}')
    code, err = _cli(capsys, "flops", "--model", str(p), "--seq", "4096")
    assert code == 2 and "not UTF-8" in err and str(p) in err


def test_folder_without_config_json(tmp_path, capsys):
    (tmp_path / "snap").mkdir()
    (tmp_path / "snap" / "model.safetensors.index.json").write_text("{}")
    code, err = _cli(capsys, "flops", "--model", str(tmp_path / "snap"), "--seq", "4096")
    assert code == 2 and "folder has no config.json" in err and str(tmp_path / "snap") in err


def test_missing_path_is_not_an_unknown_model(tmp_path, capsys):
    code, err = _cli(capsys, "flops", "--model", str(tmp_path / "nope" / "snap"), "--seq", "4096")
    assert code == 2 and "no such file or folder" in err and "closest" not in err


def test_snapshot_folder_is_read_like_its_config(tmp_path):
    snap = tmp_path / "Qwen3-30B-A3B"
    snap.mkdir()
    _write(snap, QWEN)
    from moetune.catalog.models import get_model

    a, b = get_model(str(snap)), get_model(str(snap / "config.json"))
    assert a == b and count_params(a).total == count_params(get_model("Qwen3-30B-A3B")).total


def test_cli_subprocess_exit_code_and_no_traceback(tmp_path):
    for value in ("48", 10**12, -512):
        data = dict(QWEN, num_hidden_layers=value) if value != -512 else dict(QWEN, hidden_size=value)
        p = _write(tmp_path, data)
        r = run_cli("estimate", "--model", str(p), "--system", "H100-SXM", "--gpus", "8", "--gbs", "64",
                    "--seq", "4096")
        assert r.returncode == 2, r.stderr
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert str(p) in r.stderr


# --- property: random corruption of real configs never escapes as anything but InputError ---------------------
_VALUES = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10**13), max_value=10**13),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5),
                    st.lists(st.integers(min_value=-3, max_value=100), max_size=4), st.dictionaries(
                        st.text(max_size=3), st.integers(), max_size=2))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from([QWEN, DSV3]), data=st.data())
def test_random_field_corruption_is_an_input_error(base, data):
    cfg = dict(base)
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        key = data.draw(st.sampled_from(sorted(cfg)))
        cfg[key] = data.draw(_VALUES)
    try:
        m = model_from_hf_dict(cfg, "fuzz/config.json")
    except InputError as exc:
        msg = str(exc)
        assert "\n" not in msg and msg.startswith("fuzz/config.json")
        return
    counts = count_params(m)
    assert 0 < counts.active <= counts.total
    assert m.moe_router_topk <= (m.num_moe_experts or m.moe_router_topk)


def test_reader_rejects_oversized_file(tmp_path):
    p = tmp_path / "config.json"
    p.write_text('{"a": "' + "x" * (17 << 20) + '"}')
    with pytest.raises(InputError, match="at most 16 MiB"):
        model_from_hf_config(p)
