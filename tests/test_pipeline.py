"""Pipeline stage contents: layout strings, list layouts, uniform / uneven splits, VPP, MTP placement."""

from __future__ import annotations

import gzip

import pytest
import yaml

from conftest import DATA
from moetune.catalog.models import get_model
from moetune.errors import LayoutError
from moetune.spec.layout import Layout
from moetune.spec.model import ModelArch
from moetune.spec.pipeline import (
    layout_to_str,
    layout_vpp,
    parse_pipeline_layout,
    pipeline_stages,
    stage_strings,
)


def toy(num_layers: int, mtp: int = 0) -> ModelArch:
    return ModelArch(
        name=f"toy{num_layers}",
        num_layers=num_layers,
        hidden_size=256,
        ffn_hidden_size=512,
        num_attention_heads=8,
        vocab_size=1000,
        mixer_pattern="A" * num_layers,
        mlp_pattern="D" * num_layers,
        mtp_num_layers=mtp,
    )


def _check_partition(model: ModelArch, ranks) -> None:
    """Every decoder layer exactly once, embedding once, loss once, all MTP layers once."""
    layers = sorted(i for r in ranks for c in r.chunks for i in c.layers)
    assert layers == list(range(model.num_layers))
    assert sum(c.embedding for r in ranks for c in r.chunks) == 1
    assert sum(c.loss for r in ranks for c in r.chunks) == 1
    assert sum(c.mtp_layers for r in ranks for c in r.chunks) == model.mtp_num_layers
    assert ranks[0].chunks[0].embedding
    assert ranks[-1].chunks[-1].loss


def test_parse_repeats():
    assert parse_pipeline_layout("Et*3|(tt|)*2m|L") == ("Ettt", "tt", "tt", "m", "L")
    assert parse_pipeline_layout("E|t*3|(t|)*3tt|m|L") == ("E", "ttt", "t", "t", "t", "tt", "m", "L")
    assert parse_pipeline_layout("Et*3|(tt|)*29,m|L")[-2:] == ("m", "L")  # cosmetic comma
    assert parse_pipeline_layout("Et|*2tL") == ("Et", "", "tL")  # x*n may repeat '|'
    assert parse_pipeline_layout("E(t(tt|)*2)*2L") == ("Ettt", "tt", "ttt", "tt", "L")  # nested groups


def test_parse_list_form():
    rows = [["embedding", "decoder"], ["decoder", "mtp", "loss"]]
    assert parse_pipeline_layout(rows) == ("Et", "tmL")
    assert parse_pipeline_layout(str(rows)) == ("Et", "tmL")
    assert layout_to_str(rows) == "Et|tmL"


@pytest.mark.parametrize(
    "bad", ["Etx|L", "E(tt|L", "Ett)|L", "E*|L", "Et**2|L", "", "[['embedding', 'foo']]", "[[1,"]
)
def test_parse_errors(bad):
    with pytest.raises(LayoutError):
        parse_pipeline_layout(bad)


def test_dsv3_pp8_vpp4():
    m = get_model("DeepSeek-V3")
    layout = Layout(pp=8, pipeline_layout="Et*3|(tt|)*29m|L")
    ranks = pipeline_stages(m, layout)
    assert len(ranks) == 8 and all(len(r.chunks) == 4 for r in ranks)
    assert layout_vpp(layout.pipeline_layout, 8) == 4
    assert len(stage_strings(m, layout)) == 32
    _check_partition(m, ranks)
    assert ranks[0].chunks[0].layers == (0, 1, 2)
    assert ranks[1].chunks[0].layers == (3, 4)
    assert ranks[0].chunks[1].layers == (17, 18)  # stage 8 -> PP rank 0, chunk 1
    # stage 30 = 'm' -> PP rank 6 chunk 3; stage 31 = 'L' -> PP rank 7 chunk 3
    assert ranks[6].chunks[3].mtp_layers == 1 and ranks[6].chunks[3].layers == ()
    assert ranks[7].chunks[3].loss and ranks[7].chunks[3].layers == ()
    assert sum(r.num_layers for r in ranks) == 61


def test_uniform_split_and_mtp_default():
    m = toy(16, mtp=1)
    ranks = pipeline_stages(m, Layout(pp=4, vpp=2))
    _check_partition(m, ranks)
    assert [c.layers for c in ranks[0].chunks] == [(0, 1), (8, 9)]
    assert [c.layers for c in ranks[3].chunks] == [(6, 7), (14, 15)]
    assert ranks[3].chunks[1].mtp_layers == 1 and ranks[3].chunks[1].loss
    ranks = pipeline_stages(m, Layout(pp=1))
    assert ranks[0].chunks[0].layers == tuple(range(16)) and ranks[0].chunks[0].embedding


def test_account_for_embedding_and_loss():
    m = toy(14)
    ranks = pipeline_stages(
        m, Layout(pp=4, account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True)
    )
    assert [r.num_layers for r in ranks] == [3, 4, 4, 3]
    _check_partition(m, ranks)
    ranks = pipeline_stages(m, Layout(pp=5, vpp=3, account_for_embedding_in_pipeline_split=True))
    assert ranks[0].chunks[0].layers == () and ranks[0].chunks[0].embedding
    assert ranks[1].chunks[0].layers == (0,) and ranks[0].chunks[1].layers == (4,)
    _check_partition(m, ranks)
    with pytest.raises(LayoutError, match="PAR-026"):
        pipeline_stages(m, Layout(pp=4, account_for_embedding_in_pipeline_split=True))


def test_first_last_stage_counts():
    m = toy(30)
    ranks = pipeline_stages(
        m, Layout(pp=4, num_layers_in_first_pipeline_stage=6, num_layers_in_last_pipeline_stage=8)
    )
    assert [r.num_layers for r in ranks] == [6, 8, 8, 8]
    _check_partition(m, ranks)
    ranks = pipeline_stages(
        m, Layout(pp=4, vpp=2, num_layers_in_first_pipeline_stage=6, num_layers_in_last_pipeline_stage=8)
    )
    assert [c.layers for c in ranks[0].chunks] == [(0, 1, 2), (15, 16, 17)]
    assert [c.layers for c in ranks[1].chunks] == [(3, 4, 5, 6), (18, 19, 20, 21)]
    _check_partition(m, ranks)


@pytest.mark.parametrize(
    ("model", "layout", "constraint"),
    [
        (toy(10), Layout(pp=4), "PAR-026"),
        (toy(16), Layout(pp=4, vpp=3), "PAR-027"),
        (toy(16), Layout(pp=1, vpp=2), "PAR-006"),
        (toy(16), Layout(pp=4, num_layers_in_first_pipeline_stage=0), "PAR-028"),
        (toy(16), Layout(pp=4, vpp=2, num_layers_in_first_pipeline_stage=3), "PAR-028"),
        (toy(16), Layout(pp=4, num_layers_in_first_pipeline_stage=3), "PAR-028"),
        (toy(16), Layout(pp=2, num_layers_in_first_pipeline_stage=8, num_layers_in_last_pipeline_stage=4), "PAR-028"),
        (
            toy(16),
            Layout(pp=4, num_layers_in_first_pipeline_stage=4, account_for_loss_in_pipeline_split=True),
            "PAR-029",
        ),
        (toy(4), Layout(pp=2, pipeline_layout="Et|ttL", account_for_loss_in_pipeline_split=True), "PAR-030"),
        (toy(4), Layout(pp=2, pipeline_layout="Et|t|ttL"), "PAR-031"),
        (toy(4), Layout(pp=2, vpp=1, pipeline_layout="Et|t|t|tL"), "PAR-031"),
        (toy(4), Layout(pp=2, pipeline_layout="tE|ttL"), "PAR-032"),
        (toy(4), Layout(pp=2, pipeline_layout="Et|tttLL"), "PAR-032"),
        (toy(4), Layout(pp=2, pipeline_layout="Et|ttL"), "PAR-032"),
        (toy(4, mtp=1), Layout(pp=2, pipeline_layout="Ett|ttL"), "PAR-032"),
        (toy(4, mtp=1), Layout(pp=2, pipeline_layout="Ettm|ttL"), "PAR-032"),
        (toy(4, mtp=2), Layout(pp=2, pipeline_layout="Ett|m|tt|mL"), "PAR-032"),
        (toy(4, mtp=1), Layout(pp=2, pipeline_layout="Et|tm|t|tL"), "PAR-032"),
    ],
)
def test_errors_name_constraint(model, layout, constraint):
    with pytest.raises(LayoutError, match=constraint):
        pipeline_stages(model, layout)


def _golden_layout_cases():
    out = []
    for path in sorted((DATA / "megatron_golden").glob("*_config.yaml")) if DATA.is_dir() else []:
        cfg = yaml.safe_load(path.read_text())
        args = cfg.get("MODEL_ARGS", {}) or {}
        if args.get("--pipeline-model-parallel-layout"):
            out.append(pytest.param(args, id=path.name))
    return out


@pytest.mark.parametrize("args", _golden_layout_cases())
def test_golden_config_layouts(args):
    n = int(args["--num-layers"])
    mtp = int(args.get("--mtp-num-layers") or 0)
    pp = int(args.get("--pipeline-model-parallel-size", 1))
    model = toy(n, mtp=mtp)
    layout = Layout(pp=pp, pipeline_layout=str(args["--pipeline-model-parallel-layout"]))
    ranks = pipeline_stages(model, layout)
    _check_partition(model, ranks)
    assert len(ranks) == pp


def test_golden_example_et3():
    ranks = pipeline_stages(toy(15, mtp=1), Layout(pp=2, pipeline_layout="Et*3|(tt|)*6mL"))
    assert [len(r.chunks) for r in ranks] == [4, 4]
    assert ranks[0].chunks[0].layers == (0, 1, 2) and ranks[0].chunks[0].embedding
    last = ranks[1].chunks[3]
    assert last.mtp_layers == 1 and last.loss and last.layers == ()
    assert ranks[0].chunks[3].layers == (13, 14)


def test_bridge_perf_recipe_layouts(shared_data):
    """Every pipeline layout of the Bridge perf recipes (string or list-of-lists form) parses, and for catalogued
    models it places exactly the model's decoder and MTP layers over PP x (stages/PP) chunks."""
    import json

    from moetune.errors import UnknownNameError
    from moetune.spec.pipeline import layout_to_str

    data = json.loads(gzip.decompress((shared_data / "perf" / "mbridge_perf_recipes.json.gz").read_bytes()))
    checked = 0
    forms = set()
    for name, entry in data["models"].items():
        for rec in entry.get("current_flat_perf_recipes_HEAD", []):
            s = rec["summary"]
            pl = s.get("pipeline_model_parallel_layout")
            if not pl or (isinstance(pl, str) and pl.startswith("unset")):
                continue
            forms.add(type(pl).__name__)
            stages = parse_pipeline_layout(pl)
            assert len(stages) % s["pp"] == 0
            try:
                model = get_model(name)
            except UnknownNameError:
                continue
            mtp = s.get("mtp_num_layers")
            if isinstance(mtp, int) and mtp != model.mtp_num_layers:
                model = model.model_copy(update={"mtp_num_layers": mtp})
            ranks = pipeline_stages(model, Layout(pp=s["pp"], pipeline_layout=layout_to_str(pl)))
            _check_partition(model, ranks)
            checked += 1
    assert forms == {"str", "list"} and checked >= 50
