"""Layout math: DP/EDP, minimum world size (lcm rule), every validation error, DP·TP·CP·PP = EDP·ETP·EP·PP = W."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moetune.catalog.models import get_model
from moetune.errors import LayoutError
from moetune.spec.layout import Layout
from moetune.spec.model import ModelArch
from moetune.spec.validate import layout_violation, min_world_size, validate_layout


def moe(
    num_layers: int = 16,
    *,
    heads: int = 32,
    groups: int | None = 8,
    experts: int = 64,
    ffn: int = 4096,
    moe_ffn: int = 1024,
    shared: int | None = None,
    mixer: str = "A",
    mlp: str = "E",
    **kw,
) -> ModelArch:
    return ModelArch(
        name="toy-moe",
        num_layers=num_layers,
        hidden_size=2048,
        ffn_hidden_size=ffn,
        num_attention_heads=heads,
        num_query_groups=groups,
        vocab_size=32000,
        mixer_pattern=mixer * num_layers,
        mlp_pattern=mlp * num_layers,
        num_moe_experts=experts if "E" in mlp else None,
        moe_ffn_hidden_size=moe_ffn if "E" in mlp else None,
        moe_shared_expert_intermediate_size=shared,
        **kw,
    )


def test_dp_edp_examples():
    # docs/domain.md §2.1: TP2 EP8 at 8/16/32 GPUs -> DP 4/8/16, EDP 1/2/4
    lay = Layout(tp=2, ep=8)
    assert [lay.dp(w) for w in (8, 16, 32)] == [4, 8, 16]
    assert [lay.edp(w) for w in (8, 16, 32)] == [1, 2, 4]


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        (Layout(tp=2, cp=3, ep=8), 24),  # TP*CP = 6, ETP*EP = 8 -> lcm 24 (not 8)
        (Layout(tp=6, ep=4), 12),  # issue example: TP*CP = 6, EP = 4
        (Layout(tp=4, ep=6), 12),  # TP4 EP6 -> 12 (not 6)
        (Layout(tp=2, pp=4, ep=8), 32),
        (Layout(tp=4, cp=2, pp=4, ep=64), 256),
        (Layout(tp=2, ep=1), 2),  # ETP defaults to TP when EP == 1
        (Layout(tp=4, ep=8, etp=2), 16),
    ],
)
def test_min_world_size_lcm(layout, expected):
    assert min_world_size(layout) == expected
    # and it is really the smallest W that passes both divisibility rules
    model = moe(num_layers=16 * layout.pp, heads=48, groups=12, experts=192, moe_ffn=96 * 16, ffn=96 * 64)
    assert layout_violation(model, layout, expected) is None
    assert all(layout_violation(model, layout, w) is not None for w in range(1, expected))


@pytest.mark.parametrize(
    ("model", "layout", "gpus", "kwargs", "rule"),
    [
        (moe(), Layout(tp=2, cp=3), 8, {}, "PAR-001"),
        (moe(), Layout(tp=2, ep=16), 8, {}, "PAR-002"),
        (moe(heads=24, groups=8), Layout(tp=16), 16, {}, "PAR-019"),
        (moe(heads=48, groups=12), Layout(tp=8), 8, {}, "PAR-020"),
        (moe(mlp="D", ffn=1000), Layout(tp=16), 16, {}, "PAR-022"),
        (moe(shared=1000), Layout(tp=16), 16, {}, "PAR-022"),
        (moe(moe_ffn=1000), Layout(ep=8, etp=16), 128, {}, "PAR-023"),
        (moe(experts=60), Layout(ep=8), 8, {}, "PAR-024"),
        (moe(mlp="D"), Layout(ep=8), 8, {}, "PAR-025"),
        (moe(num_layers=10), Layout(pp=4), 4, {}, "PAR-026"),
        (moe(num_layers=16), Layout(pp=4, vpp=3), 4, {}, "PAR-027"),
        (moe(num_layers=16), Layout(pp=1, vpp=2), 4, {}, "PAR-006"),
        (moe(num_layers=4), Layout(pp=2, pipeline_layout="Et|t|ttL"), 2, {}, "PAR-031"),
        (moe(num_layers=4), Layout(pp=2, pipeline_layout="Et|ttL"), 2, {}, "PAR-032"),
        (moe(), Layout(cp=4), 4, {"seq_length": 4100}, "PAR-014"),
        (moe(), Layout(tp=4), 4, {"seq_length": 4098, "sequence_parallel": True}, "PAR-018"),
        (moe(), Layout(tp=2), 2, {"sequence_parallel": False}, "PAR-046"),
        (moe(), Layout(tp=2), 16, {"global_batch_size": 12, "micro_batch_size": 1}, "PAR-035"),
        (moe(), Layout(tp=2), 16, {"global_batch_size": 16, "micro_batch_size": 4}, "PAR-035"),
        (moe(), Layout(pp=4, vpp=2), 16, {"global_batch_size": 8}, "PAR-037"),
        (moe(), Layout(pp=4, vpp=2), 16, {"global_batch_size": 24}, "PAR-038"),
        (
            moe(mixer="G", linear_num_key_heads=6, linear_num_value_heads=12),
            Layout(tp=4),
            4,
            {},
            "PAR-021",
        ),
        (moe(mixer="M", mamba_num_heads=64, mamba_num_groups=8), Layout(pp=2, vpp=2), 2, {}, "PAR-034"),
        (moe(mixer="M", mamba_num_heads=48, mamba_num_groups=6), Layout(tp=4), 4, {}, "mamba_num_groups"),
        # MambaContextParallel.__init__: heads/TP % CP, groups/TP and CP one a multiple of the other
        (moe(mixer="M", mamba_num_heads=24, mamba_num_groups=8), Layout(tp=2, cp=8), 16, {}, "mamba_num_heads/TP"),
        (moe(mixer="M", mamba_num_heads=48, mamba_num_groups=6), Layout(tp=2, cp=2), 4, {}, "mamba_num_groups/TP"),
    ],
)
def test_every_layout_error(model, layout, gpus, kwargs, rule):
    with pytest.raises(LayoutError, match=rule):
        validate_layout(model, layout, gpus, **kwargs)
    msg = layout_violation(model, layout, gpus, **kwargs)
    assert msg is not None and rule in msg and "\n" not in msg


def test_legal_layouts_pass():
    dsv3 = get_model("DeepSeek-V3")
    validate_layout(
        dsv3,
        Layout(tp=1, pp=8, ep=32, pipeline_layout="Et*3|(tt|)*29m|L"),
        256,
        global_batch_size=8192,
        micro_batch_size=1,
        seq_length=4096,
        sequence_parallel=False,
    )
    # GQA: TP larger than query groups is legal when TP is a multiple (KV heads replicated)
    validate_layout(moe(heads=32, groups=4), Layout(tp=8), 8)
    qwen = get_model("Qwen3-30B-A3B")
    validate_layout(qwen, Layout(tp=1, ep=16), 16, global_batch_size=512, seq_length=4096)


def test_error_message_is_one_line_and_names_values():
    with pytest.raises(LayoutError) as info:
        validate_layout(moe(), Layout(tp=2, cp=3, ep=8), 16)
    text = str(info.value)
    assert "\n" not in text and "16" in text and "PAR-001" in text and "24" in text  # says the minimum


# ------------------------------------------------------------------------------------------------------------
# property: both meshes tile the world
# ------------------------------------------------------------------------------------------------------------

_sizes = st.sampled_from([1, 2, 3, 4, 6, 8, 16])


@settings(max_examples=300, deadline=None)
@given(tp=_sizes, cp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2, 3, 4]), ep=_sizes,
       etp=st.sampled_from([None, 1, 2, 4]), mult=st.integers(1, 6))
def test_meshes_tile_world(tp, cp, pp, ep, etp, mult):
    layout = Layout(tp=tp, cp=cp, pp=pp, ep=ep, etp=etp)
    w_min = min_world_size(layout)
    model = moe(num_layers=12 * pp, heads=48 * 16, groups=48 * 16, experts=48 * 16, moe_ffn=48 * 64, ffn=48 * 64)
    for w in (w_min * mult, w_min * mult + 1):
        ok = layout_violation(model, layout, w) is None
        if ok:
            assert layout.dp(w) * tp * cp * pp == w
            assert layout.edp(w) * layout.expert_tp * ep * pp == w
            assert w % w_min == 0
        else:
            assert w % w_min != 0


def test_layout_helpers():
    lay = Layout(pp=8, ep=32, pipeline_layout="Et*3|(tt|)*29m|L")
    assert lay.vpp_size == 4  # VPP from the layout string (MCore PipelineParallelLayerLayout)
    assert Layout(pp=4, vpp=2).vpp_size == 2 and Layout().vpp_size == 1
    assert Layout(tp=2, cp=3, ep=8).min_world_size() == 24
    assert Layout(tp=2, ep=8).num_microbatches(32, 64, 2) == 2


def test_validate_job():
    from moetune.catalog.systems import get_system
    from moetune.spec.job import Job
    from moetune.spec.validate import validate_job

    job = Job(model=get_model("Qwen3-30B-A3B"), system=get_system("H100"), gpus=16, global_batch_size=512,
              seq_length=4096, layout=Layout(tp=2, ep=8))
    validate_job(job)
    assert job.num_microbatches == 64
    with pytest.raises(LayoutError, match="PAR-035"):
        validate_job(job.with_(global_batch_size=500))
    with pytest.raises(LayoutError, match="PAR-002"):
        validate_job(job.with_(layout=Layout(tp=2, ep=32)))


def test_matches_megatron_world_size_assert(shared_data):
    """logs/log_assert_world_size_ep_1.txt: PP2 x EP8 x ETP1 on 8 GPUs -> Megatron asserts 8 % 16 (PAR-002)."""
    import re

    text = (shared_data / "logs" / "log_assert_world_size_ep_1.txt").read_text()
    w, size = map(int, re.search(r"world_size \((\d+)\) is not divisible by \S+ size \((\d+)\)", text).groups())
    layout = Layout(pp=2, ep=8, etp=1)
    msg = layout_violation(moe(num_layers=16), layout, w)
    assert msg is not None and "PAR-002" in msg and f"= {size} " in msg
    assert min_world_size(layout) == size


def _perf_rows(shared_data):
    import csv
    import re

    from moetune.errors import UnknownNameError

    def iv(x: str) -> int | None:
        x = x.strip()
        if x in ("", "n/a"):
            return None
        if not re.fullmatch(r"\d+", x):
            raise ValueError(x)
        return int(x)

    out = []
    for r in csv.DictReader((shared_data / "perf" / "mbridge_perf_calibration.csv").open()):
        try:
            arch = get_model(r["model"])
            v = {k: iv(r[k]) for k in ("tp", "pp", "cp", "vp", "ep", "etp", "gbs", "mbs", "seq_len", "num_gpus")}
        except (UnknownNameError, ValueError):  # model not catalogued / "2 (4)" alternative-value cells
            continue
        lay = Layout(tp=v["tp"] or 1, pp=v["pp"] or 1, cp=v["cp"] or 1, vpp=v["vp"] if (v["vp"] or 1) > 1 else None,
                     ep=v["ep"] or 1, etp=v["etp"])
        out.append((r, arch, lay, v))
    return out


def test_published_bridge_configs_are_legal(shared_data):
    """Every published Megatron-Bridge perf row (current) passes world-size / heads / experts / batch / CP rules.

    The table has no pipeline-layout strings, so the pipeline-split rules (PAR-026..028) are not judged here.
    """
    import re

    rows = _perf_rows(shared_data)
    assert len(rows) > 100
    flagged = []
    for r, arch, lay, v in rows:
        msg = layout_violation(arch, lay, v["num_gpus"], global_batch_size=v["gbs"], micro_batch_size=v["mbs"],
                               seq_length=v["seq_len"])
        if msg and not re.search(r"PAR-02[678]", msg):
            flagged.append((r["status"], r["release"], r["system"], lay.short(), msg))
    # the only impossible row is a superseded 25.11 DeepSeek-V3 GB300 entry: PP8 x EP64 = 512 ranks on 256 GPUs
    assert [f[:3] for f in flagged] == [("superseded_published_on_main", "25.11", "DGX-GB300")], flagged
    assert "PAR-002" in flagged[0][4]
