"""``moetune recipes``: the Megatron-Bridge perf recipes moetune ships (:mod:`moetune.catalog.recipes`), with their
layout and key features; any of them is an input to ``estimate --recipe``, ``plan --recipe`` and ``check --recipe``."""

from typing import Annotated, Any

import typer

from moetune.output import console, print_json


def select_recipes(*, model: str | None = None, system: str | None = None, gpus: int | None = None,
                   precision: str | None = None, task: str | None = None) -> list[dict[str, Any]]:
    """Summaries (:func:`moetune.catalog.recipes.recipe_summary`) of the recipes matching every filter given: the
    model by catalog identity (aliases resolved; a name outside the catalog matches the recipe's model name), the
    system by identity (a GB200 system never matches a B200 recipe), the precision by its canonical name."""
    from moetune.catalog.recipes import list_recipes, name_key, recipe_summary, system_identity
    from moetune.errors import InputError
    from moetune.io.load import RECIPE_PRECISION
    from moetune.spec.features import parse_precision

    names: set[str] | None = None
    if model:
        from moetune.catalog.models import get_model

        try:
            arch = get_model(model)
            names = {name_key(n) for n in (arch.name, *arch.aliases)}
        except InputError:
            names = {name_key(model)}
    sysid = None
    if system:
        from moetune.catalog.systems import get_system

        sysid = name_key(get_system(system).name)
    prec = RECIPE_PRECISION[parse_precision(precision)] if precision else None
    if gpus is not None and gpus < 1:
        raise InputError.bad_value("--gpus", gpus, "a positive integer")
    out = []
    for r in list_recipes():
        if names is not None and name_key(r["model"]) not in names:
            continue
        if sysid is not None and sysid not in (system_identity(r["system"]), system_identity(r["gpu"])):
            continue
        if gpus is not None and r["gpus"] != gpus:
            continue
        if prec is not None and r["precision"] != prec:
            continue
        if task and r["task"] != task:
            continue
        out.append(recipe_summary(r["name"]))
    return out


def _layout_text(lay: dict[str, Any]) -> str:
    s = f"TP{lay['tp']} PP{lay['pp']}" + (f" VPP{lay['vpp']}" if lay.get("vpp") else "")
    s += f" CP{lay['cp']} EP{lay['ep']}" + (f" ETP{lay['etp']}" if lay.get("etp") is not None else "")
    if lay.get("pipeline_layout"):
        s += " +layout"
    if lay.get("account_for_embedding_in_pipeline_split") or lay.get("account_for_loss_in_pipeline_split"):
        s += " +acct"
    return s


def _features_text(f: dict[str, Any]) -> str:
    parts = [f["dispatcher"]]
    if f["recompute"] != "none":
        parts.append(f"recompute {f['recompute']}")
    if f["cuda_graph_scope"] != "none":
        parts.append(f"graphs {f['cuda_graph_scope']}")
    if f["ep_overlap"]:
        parts.append("EP overlap" + (" + delayed wgrad" if f["delay_wgrad"] else ""))
    if f["tp_comm_overlap"]:
        parts.append("TP overlap")
    if f["fsdp"]:
        parts.append("FSDP")
    if f["offload"] != "none":
        parts.append(f"offload {f['offload']}")
    return ", ".join(parts)


def register(app: typer.Typer) -> None:
    @app.command("recipes")
    def recipes_cmd(
        model: Annotated[str | None, typer.Option(help="Only this model (catalog name or alias).")] = None,
        system: Annotated[str | None, typer.Option(help="Only this system (GB200-NVL72, DGX-H100, ...).")] = None,
        gpus: Annotated[int | None, typer.Option(help="Only recipes for this GPU count.")] = None,
        precision: Annotated[str | None, typer.Option(help="Only this precision (bf16, fp8_cs, mxfp8, ...).")] = None,
        task: Annotated[str | None, typer.Option(help="pretrain or sft (default: both).")] = None,
        json_out: Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout.")] = False,
    ) -> None:
        """List the shipped Megatron-Bridge perf recipes (name, layout, key features)."""
        from rich.table import Table

        rows = select_recipes(model=model, system=system, gpus=gpus, precision=precision, task=task)
        if json_out:
            print_json({"recipes": rows, "count": len(rows)})
            return
        t = Table(title=f"Megatron-Bridge perf recipes ({len(rows)})")
        for c in ("recipe", "model", "system", "GPUs", "precision", "layout", "GBS/MBS/seq", "key features"):
            t.add_column(c)
        for r in rows:
            t.add_row(r["name"], r["model"] + ("" if r["arch_known"] else " (arch unknown)"), r["system"],
                      str(r["gpus"]), r["precision"], _layout_text(r["layout"]), f"{r['gbs']}/{r['mbs']}/{r['seq']}",
                      _features_text(r["features"]))
        console.print(t)
        console.print("use one with: moetune estimate --recipe NAME | moetune plan --recipe NAME | "
                      "moetune check --recipe NAME", style="dim", markup=False)
