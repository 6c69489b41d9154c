"""``moetune layout``: DP / EDP / microbatches, minimum world size, both Parallel-Folding meshes and the NVLink
crossing report for one parallel layout (optionally checked against a model and a batch shape)."""

from typing import Annotated, Any

import typer

from moetune.errors import InputError, LayoutError
from moetune.output import console, print_json, readable

DEFAULT_SYSTEM = "DGX-H100"
_EXAMPLE_MAX = 32  #: ranks listed per example group in the output


def _pos(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise InputError.bad_value(name, value, "a positive integer")


def layout_report(
    *,
    gpus: int,
    tp: int = 1,
    pp: int = 1,
    vpp: int | None = None,
    cp: int = 1,
    ep: int = 1,
    etp: int | None = None,
    pipeline_layout: str | None = None,
    system: str = DEFAULT_SYSTEM,
    model: str | None = None,
    gbs: int | None = None,
    mbs: int = 1,
    seq: int | None = None,
    tp_pp_dp_mapping: bool = False,
    ranks_per_domain: int | None = None,
    sequence_parallel: bool | None = None,
) -> dict[str, Any]:
    """Everything ``moetune layout`` prints, as a dict (raises :class:`InputError` / :class:`LayoutError`)."""
    from moetune.catalog.systems import get_system
    from moetune.spec.layout import Layout
    from moetune.spec.ranks import DEFAULT_ORDER, TP_PP_DP_ORDER, groups_crossing_nvlink
    from moetune.spec.validate import layout_violation, layout_violation_without_model, min_world_size

    for name, val in (("--gpus", gpus), ("--tp", tp), ("--pp", pp), ("--vpp", vpp), ("--cp", cp), ("--ep", ep),
                      ("--etp", etp), ("--gbs", gbs), ("--mbs", mbs), ("--seq", seq),
                      ("--ranks-per-domain", ranks_per_domain)):
        _pos(name, val)
    sysm = get_system(system)
    lay = Layout(tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, pipeline_layout=pipeline_layout)
    arch = None
    if model is not None:
        from moetune.catalog.models import get_model

        arch = get_model(model)
        msg = layout_violation(arch, lay, gpus, global_batch_size=gbs, micro_batch_size=mbs, seq_length=seq,
                               sequence_parallel=tp > 1 if sequence_parallel is None else sequence_parallel)
    else:
        msg = layout_violation_without_model(lay, gpus, global_batch_size=gbs, micro_batch_size=mbs, seq_length=seq,
                                             sequence_parallel=tp > 1 if sequence_parallel is None else sequence_parallel)
    if msg is not None:
        raise LayoutError(f"{lay.short()} on {gpus} GPUs: {msg}", field="layout")

    order = TP_PP_DP_ORDER if tp_pp_dp_mapping else DEFAULT_ORDER
    domain = sysm.nvlink_domain
    if ranks_per_domain is not None:
        if ranks_per_domain > domain:
            raise InputError.bad_value("--ranks-per-domain", ranks_per_domain, f"at most the NVLink domain ({domain})")
        domain = ranks_per_domain
    dp, edp, e_tp = lay.dp(gpus), lay.edp(gpus), lay.expert_tp
    out: dict[str, Any] = {
        "gpus": gpus,
        "system": sysm.name,
        "gpus_per_node": sysm.gpus_per_node,
        "nvlink_domain": sysm.nvlink_domain,
        "ranks_per_domain": domain,
        "rank_order": order,
        "tp": tp, "pp": pp, "vpp": None, "cp": cp, "ep": ep, "etp": e_tp,
        "dp": dp,
        "edp": edp,
        "num_microbatches": lay.num_microbatches(gpus, gbs, mbs) if gbs is not None else None,
        "min_gpus": min_world_size(lay),
        "attention_mesh": {"tp": tp, "cp": cp, "dp": dp, "pp": pp, "shape": f"TP{tp}×CP{cp}×DP{dp}×PP{pp}"},
        "moe_mesh": {"etp": e_tp, "ep": ep, "edp": edp, "pp": pp, "shape": f"ETP{e_tp}×EP{ep}×EDP{edp}×PP{pp}"},
    }
    if etp is None:
        out["etp_note"] = "expert_tensor_parallel_size unset: Bridge default (1 when EP > 1, else TP)"
    crossings = []
    for c in groups_crossing_nvlink(lay, gpus, domain, order=order):
        d = {
            "group": c.kind, "group_size": c.group_size, "num_groups": c.num_groups, "num_crossing": c.num_crossing,
            "max_domains_spanned": c.max_domains_spanned, "example": c.example[:_EXAMPLE_MAX],
            "severity": c.severity, "rule": c.rule, "note": c.note,
        }
        if len(c.example) > _EXAMPLE_MAX:
            d["example_truncated"] = True
        crossings.append(d)
    out["groups_crossing_nvlink"] = crossings
    if arch is not None:
        from moetune.spec.pipeline import pipeline_stages

        ranks = pipeline_stages(arch, lay)
        out["model"] = arch.name
        out["vpp"] = len(ranks[0].chunks)
        out["pipeline"] = [
            {
                "pp_rank": r.pp_rank,
                "num_layers": r.num_layers,
                "chunks": [
                    {"vchunk": c.vchunk, "layers": list(c.layers), "embedding": c.embedding, "loss": c.loss,
                     "mtp_layers": c.mtp_layers}
                    for c in r.chunks
                ],
            }
            for r in ranks
        ]
    else:
        from moetune.spec.pipeline import layout_vpp

        out["vpp"] = layout_vpp(pipeline_layout, pp) if pipeline_layout else (vpp or 1)
    return out


def _span(layers: list[int]) -> str:
    if not layers:
        return "-"
    return f"{layers[0]}" if len(layers) == 1 else f"{layers[0]}-{layers[-1]}"


def _render(rep: dict[str, Any]) -> None:
    from rich.table import Table

    console.print(
        f"[bold]{rep['gpus']} GPUs[/] on {rep['system']} "
        f"({rep['gpus_per_node']} GPUs/node, NVLink domain {rep['nvlink_domain']}"
        + (f", {rep['ranks_per_domain']} ranks placed per domain" if rep["ranks_per_domain"] != rep["nvlink_domain"]
           else "")
        + f"; rank order {rep['rank_order']})"
    )
    a, m = rep["attention_mesh"], rep["moe_mesh"]
    console.print(f"  Attention: TP{a['tp']} × CP{a['cp']} × DP{a['dp']} × PP{a['pp']}")
    console.print(f"  MoE:       ETP{m['etp']} × EP{m['ep']} × EDP{m['edp']} × PP{m['pp']}")
    extra = f", microbatches {rep['num_microbatches']}" if rep["num_microbatches"] is not None else ""
    console.print(f"  VPP {rep['vpp']}, minimum GPUs PP·lcm(TP·CP, ETP·EP) = {rep['min_gpus']}{extra}")
    if rep.get("etp_note"):
        console.print(f"  [dim]{rep['etp_note']}[/]")
    if rep["groups_crossing_nvlink"]:
        t = Table(title="Groups crossing an NVLink domain", show_lines=False)
        for col in ("group", "size", "crossing", "domains", "example", "rule"):
            t.add_column(col)
        for c in rep["groups_crossing_nvlink"]:
            color = "yellow" if c["severity"] == "warning" else "dim"
            ex = c["example"]
            ex_s = ",".join(map(str, ex[:8])) + (",…" if len(ex) > 8 or c.get("example_truncated") else "")
            t.add_row(f"[{color}]{c['group'].upper()}[/]", str(c["group_size"]),
                      f"{c['num_crossing']}/{c['num_groups']}", str(c["max_domains_spanned"]), ex_s, c["rule"])
        console.print(readable(t))
    else:
        console.print("  No group crosses an NVLink domain.")
    if rep.get("pipeline"):
        t = Table(title=f"Pipeline stages ({rep['model']}): decoder layers per chunk, E = embedding")
        t.add_column("PP rank")
        for v in range(rep["vpp"]):
            t.add_column(f"chunk {v}")
        for r in rep["pipeline"]:
            cells = []
            for c in r["chunks"]:
                parts = (["E"] if c["embedding"] else []) + ([_span(c["layers"])] if c["layers"] else [])
                parts += ([f"MTP×{c['mtp_layers']}"] if c["mtp_layers"] else []) + (["loss"] if c["loss"] else [])
                cells.append(" ".join(parts) or "(empty)")
            t.add_row(str(r["pp_rank"]), *cells)
        console.print(readable(t))


def register(app: typer.Typer) -> None:
    @app.command("layout")
    def layout_cmd(
        gpus: Annotated[int, typer.Option(help="World size W.")],
        tp: Annotated[int, typer.Option(help="tensor_model_parallel_size.")] = 1,
        pp: Annotated[int, typer.Option(help="pipeline_model_parallel_size.")] = 1,
        vpp: Annotated[int | None, typer.Option(help="virtual_pipeline_model_parallel_size.")] = None,
        cp: Annotated[int, typer.Option(help="context_parallel_size.")] = 1,
        ep: Annotated[int, typer.Option(help="expert_model_parallel_size.")] = 1,
        etp: Annotated[int | None, typer.Option(help="expert_tensor_parallel_size (default: 1 if EP>1 else TP).")] = None,
        pipeline_layout: Annotated[
            str | None, typer.Option("--pipeline-layout", help="pipeline_model_parallel_layout, e.g. 'Et*3|(tt|)*29m|L'.")
        ] = None,
        system: Annotated[str, typer.Option(help="Catalog system name or system YAML.")] = DEFAULT_SYSTEM,
        model: Annotated[
            str | None, typer.Option(help="Model name / HF config.json: check heads, experts, layers; list stages.")
        ] = None,
        gbs: Annotated[int | None, typer.Option(help="Global batch size (sequences).")] = None,
        mbs: Annotated[int, typer.Option(help="Micro batch size.")] = 1,
        seq: Annotated[int | None, typer.Option(help="Sequence length (checks s % 2CP and, with SP, (s/CP) % TP).")] = None,
        sequence_parallel: Annotated[
            bool | None,
            typer.Option("--sequence-parallel/--no-sequence-parallel", help="SP (default: on when TP > 1)."),
        ] = None,
        tp_pp_dp_mapping: Annotated[
            bool, typer.Option("--tp-pp-dp-mapping", help="Rank order tp-cp-ep-pp-dp (Bridge dist.use_tp_pp_dp_mapping).")
        ] = False,
        ranks_per_domain: Annotated[
            int | None,
            typer.Option(help="Ranks the scheduler places per NVLink domain (e.g. 64 of an NVL72); default: all."),
        ] = None,
        json_out: Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")] = False,
    ) -> None:
        """DP/EDP, microbatches, minimum GPUs, Parallel-Folding meshes and NVLink-crossing groups of a layout."""
        rep = layout_report(gpus=gpus, tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, pipeline_layout=pipeline_layout,
                            system=system, model=model, gbs=gbs, mbs=mbs, seq=seq,
                            tp_pp_dp_mapping=tp_pp_dp_mapping, ranks_per_domain=ranks_per_domain,
                            sequence_parallel=sequence_parallel)
        if json_out:
            print_json(rep)
        else:
            _render(rep)
