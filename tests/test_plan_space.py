"""The planner's search space: divisibility invariants, --fix pins, generated pipeline layouts."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from moetune.catalog.models import get_model
from moetune.catalog.systems import get_system
from moetune.plan.space import SpaceLimits, balanced_layout, divisors, enumerate_layouts
from moetune.spec.layout import Layout
from moetune.spec.pipeline import pipeline_stages


def test_divisors():
    assert divisors(12) == [1, 2, 3, 4, 6, 12]
    assert divisors(1) == [1]
    assert divisors(61) == [1, 61]


def test_every_layout_satisfies_both_meshes():
    m, s = get_model("DeepSeek-V3"), get_system("DGX-H100")
    n = 0
    for lp in enumerate_layouts(m, s, 256, 4096, 4096):
        n += 1
        assert lp.dp * lp.tp * lp.cp * lp.pp == 256
        assert lp.edp * lp.etp * lp.ep * lp.pp == 256
        assert 256 % (lp.mbs * lp.dp) == 0 or 4096 % (lp.mbs * lp.dp) == 0
        assert 4096 % (lp.mbs * lp.dp) == 0
        assert 256 % lp.ep == 0  # experts divisible by EP
        assert lp.tp <= s.nvlink_domain
    assert n > 100


def test_fix_pins_dimensions():
    m, s = get_model("DeepSeek-V3"), get_system("DGX-H100")
    lim = SpaceLimits(fix={"tp": 2, "ep": 64, "pp": 8})
    pts = list(enumerate_layouts(m, s, 1024, 8192, 4096, lim))
    assert pts and all(p.tp == 2 and p.ep == 64 and p.pp == 8 for p in pts)


@settings(max_examples=60, deadline=None)
@given(layers=st.integers(4, 96), pp=st.sampled_from([2, 4, 8, 16]), vpp=st.sampled_from([1, 2, 4]),
       mtp=st.integers(0, 1))
def test_balanced_layout_is_a_valid_megatron_layout(layers, pp, vpp, mtp):
    stages = pp * vpp
    text = balanced_layout(layers, stages, mtp)
    if text is None:
        assert layers % stages == 0 and mtp == 0 or layers < stages
        return
    assert text.count("E") == 1 and text.count("L") == 1
    assert text.count("t") == layers and text.count("m") == mtp
    assert text.count("|") == stages - 1
    m = get_model("DeepSeek-V3").model_copy(update={"num_layers": layers, "mixer_pattern": "A" * layers,
                                                     "mlp_pattern": "E" * layers, "mtp_num_layers": mtp})
    ranks = pipeline_stages(m, Layout(pp=pp, vpp=vpp if vpp > 1 else None, pipeline_layout=text))
    assert sum(r.num_layers for r in ranks) == layers
    assert ranks[0].chunks[0].embedding


def test_dsv3_balanced_layout_matches_published_shape():
    # the published DSV3 H100 layout Et*3|(tt|)*29m|L puts 61 layers on 32 stages; ours does too
    text = balanced_layout(61, 32, 1)
    assert text.count("t") == 61 and text.count("|") == 31


def _rank_loads(text: str, pp: int, weights, mtp_w: float, loss_w: float) -> list[float]:
    loads = [0.0] * pp
    at = 0
    for k, stage in enumerate(text.split("|")):
        n = stage.count("t")
        loads[k % pp] += sum(weights[at:at + n]) + stage.count("m") * mtp_w + stage.count("L") * loss_w
        at += n
    return loads


def test_flops_weighted_layout_unloads_the_mtp_and_loss_stage():
    from moetune.plan.space import stage_weights

    m = get_model("DeepSeek-V3")
    w, mtp_w, loss_w = stage_weights(m, 4096)
    assert mtp_w > w[-1] and loss_w > 0  # an MTP depth is a layer plus its own output layer
    weighted = balanced_layout(61, 16, 1, pp=16, layer_weights=w, mtp_weight=mtp_w, loss_weight=loss_w,
                               embedding_weight=0.0)
    unit = balanced_layout(61, 16, 1)
    stages = weighted.split("|")
    assert stages[-1].count("t") < max(s.count("t") for s in stages[1:-1])
    assert max(_rank_loads(weighted, 16, w, mtp_w, loss_w)) <= max(_rank_loads(unit, 16, w, mtp_w, loss_w))
    ranks = pipeline_stages(m, Layout(pp=16, pipeline_layout=weighted))
    assert sum(r.num_layers for r in ranks) == 61



def test_parallel_shares_partition_the_layouts():
    """The shares of the parallel search (Search.pass_1 with ``partition``: enumerate_layouts asks ``keep`` before
    building a group's layouts) queue disjoint sets of layouts whose union is the single search's queue, count the
    whole space between them, and keep every (TP, CP, EP, ETP) group in one share."""
    from dataclasses import replace

    from moetune.plan.search import PlanRequest, Search

    req = PlanRequest(model=get_model("DeepSeek-V2-Lite"), system=get_system("DGX-H100"), gpus=64,
                      global_batch_size=512, seq_length=4096, workers=1)
    whole = Search(req)
    whole.pass_1()
    want = [(lp.key(), mode) for lp, mode in whole.queue]
    for n in (2, 3):
        queues, groups, layouts = [], [], 0
        for i in range(n):
            share = Search(replace(req, partition=(i, n)))
            share.pass_1()
            layouts += share.layouts
            queues.append([(lp.key(), mode) for lp, mode in share.queue])
            groups.append({(lp.tp, lp.cp, lp.ep, lp.etp) for lp, _ in share.queue})
            assert queues[-1]
        assert layouts == whole.layouts
        assert sorted(x for q in queues for x in q) == sorted(want)
        assert sum(len(g) for g in groups) == len(set().union(*groups))


def test_batch_violation_is_layout_violation_of_an_accepted_layout():
    """The enumeration validates a layout once and then only the batch rules of each MBS (batch_violation): for every
    layout that layout_violation accepts without a batch, both give the same answer for every (GBS, MBS), accepted or
    not (PAR-035 divisibility, PAR-037/038 interleaved microbatch counts)."""
    from moetune.spec.validate import batch_violation, layout_violation

    checked = rejected = 0
    for name, gpus, seq in (("DeepSeek-V3", 256, 4096), ("Qwen3-30B-A3B", 16, 4096), ("Llama-3-70B", 64, 8192)):
        model = get_model(name)
        for lp in enumerate_layouts(model, get_system("DGX-H100"), gpus, 1024, seq, SpaceLimits(mbs_options=(1,))):
            lay = Layout(tp=lp.tp, pp=lp.pp, vpp=lp.vpp if lp.vpp > 1 else None, pipeline_layout=lp.pipeline_layout,
                         cp=lp.cp, ep=lp.ep, etp=lp.etp)
            assert layout_violation(model, lay, gpus, seq_length=seq, sequence_parallel=lp.tp > 1) is None
            for gbs in (96, 256, 1024, 3000):
                for mbs in (1, 2, 3, 4):
                    want = layout_violation(model, lay, gpus, global_batch_size=gbs, micro_batch_size=mbs)
                    assert batch_violation(model, lay, gpus, gbs, mbs) == want
                    checked += 1
                    rejected += want is not None
    assert checked > 1000 and 0 < rejected < checked


def test_meshes_are_the_layouts_grouped_with_their_validated_layout():
    """enumerate_meshes yields the points of enumerate_layouts in order, grouped by mesh and split, each with the
    Layout that validation builds from them (same fields and fields set); a pin below 1 is still validated."""
    import pytest
    from pydantic import ValidationError

    from moetune.plan.space import enumerate_meshes

    for name, gpus, gbs, lim in (("DeepSeek-V3", 256, 4096, None), ("Llama-3-70B", 64, 128, None),
                                 ("DeepSeek-V3", 1024, 8192, SpaceLimits(fix={"pp": 16, "mbs": 1}))):
        model, system = get_model(name), get_system("DGX-H100")
        meshes = list(enumerate_meshes(model, system, gpus, gbs, 4096, lim))
        assert [p for _, pts in meshes for p in pts] == list(enumerate_layouts(model, system, gpus, gbs, 4096, lim))
        assert len({(p.tp, p.cp, p.pp, p.vpp, p.ep, p.etp) for _, pts in meshes for p in pts}) == len(meshes)
        for lay, pts in meshes:
            assert pts and len({p.key()[:6] + p.key()[7:] for p in pts}) == 1
            p = pts[0]
            want = Layout(tp=p.tp, pp=p.pp, vpp=p.vpp if p.vpp > 1 else None, pipeline_layout=p.pipeline_layout,
                          cp=p.cp, ep=p.ep, etp=p.etp)
            fields = {k: v for k, v in lay.__dict__.items() if not k.startswith("_")}  # not the cached split
            assert lay == want and fields == want.__dict__ and lay.model_fields_set == want.model_fields_set
    with pytest.raises(ValidationError):
        list(enumerate_layouts(get_model("DeepSeek-V2-Lite"), get_system("DGX-H100"), 16, 256, 4096,
                               SpaceLimits(fix={"etp": -1})))
