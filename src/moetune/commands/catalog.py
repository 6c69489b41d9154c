"""``moetune catalog models|systems`` and ``moetune model show``: the embedded model and system catalogs."""

from typing import Annotated, Any

import typer

from moetune.output import console, print_json, readable

JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")]


def model_summary(model) -> dict[str, Any]:
    """Catalog row of one model: name, aliases, family, parameter counts, published counts, source."""
    from moetune.perfmodel.params import count_params

    c = count_params(model)
    return {
        "name": model.name,
        "aliases": list(model.aliases),
        "family": model.family,
        "hf_id": model.hf_id,
        "num_layers": model.num_layers,
        "num_moe_experts": model.num_moe_experts,
        "moe_router_topk": model.moe_router_topk if model.is_moe else None,
        "mtp_num_layers": model.mtp_num_layers,
        "total_params": c.total,
        "total_params_without_mtp": c.total_without_mtp,
        "active_params": c.active,
        "published_total_params": model.published_total_params,
        "published_active_params": model.published_active_params,
        "source": model.source,
    }


def model_detail(model) -> dict[str, Any]:
    """``model show``: the full architecture plus parameter counts by component."""
    from moetune.perfmodel.params import count_params

    c = count_params(model)
    out = model.model_dump(mode="json")
    out.update(
        padded_vocab_size=model.padded_vocab_size(1),
        total_params=c.total,
        total_params_without_mtp=c.total_without_mtp,
        active_params=c.active,
        active_params_with_mtp=c.active_with_mtp,
        params_by_component=c.by_component,
        param_assumptions=list(c.assumptions),
    )
    return out


def system_summary(system) -> dict[str, Any]:
    return {
        "name": system.name,
        "aliases": list(system.aliases),
        "gpu": system.gpu.name,
        "gpus_per_node": system.gpus_per_node,
        "nvlink_domain": system.nvlink_domain,
        "hbm_gib": system.gpu.hbm_gib,
        "hbm_bw_gbs": system.gpu.hbm_bw_gbs,
        "peak_tflops": dict(system.gpu.peak_tflops),
        "nvlink_bw_gbs": system.nvlink_bw_gbs,
        "scaleout_bw_gbs": system.scaleout_bw_gbs,
        "host_cpu": system.host_cpu,
    }


def _b(n: int | float | None) -> str:
    if n is None:
        return "-"
    return f"{n / 1e12:.3f}T" if n >= 1e12 else f"{n / 1e9:.2f}B"


def register(app: typer.Typer) -> None:
    catalog = typer.Typer(help="List the embedded model and system catalogs.", no_args_is_help=True)
    model_app = typer.Typer(help="Inspect one model (catalog name/alias or a Hugging Face config.json).",
                            no_args_is_help=True)

    @catalog.command("models")
    def catalog_models(json_out: JsonOpt = False) -> None:
        """All catalog models with total and active parameter counts."""
        from rich.table import Table

        from moetune.catalog.models import list_models

        rows = [model_summary(m) for m in list_models()]
        if json_out:
            print_json(rows)
            return
        t = Table(title="moetune model catalog")
        for col in ("name", "family", "layers", "experts (top-k)", "MTP", "total", "active", "published total"):
            t.add_column(col)
        for r in rows:
            ex = f"{r['num_moe_experts']} ({r['moe_router_topk']})" if r["num_moe_experts"] else "dense"
            t.add_row(r["name"], r["family"], str(r["num_layers"]), ex, str(r["mtp_num_layers"]),
                      _b(r["total_params"]), _b(r["active_params"]), _b(r["published_total_params"]))
        console.print(readable(t, names=("name",)))

    @catalog.command("systems")
    def catalog_systems(json_out: JsonOpt = False) -> None:
        """All catalog systems: GPUs per node, NVLink domain, HBM, dense peak TFLOP/s per precision."""
        from rich.table import Table

        from moetune.catalog.systems import list_systems

        rows = [system_summary(s) for s in list_systems()]
        if json_out:
            print_json(rows)
            return
        t = Table(title="moetune system catalog")
        for col in ("name", "aliases", "GPU", "GPUs/node", "NVLink domain", "HBM GiB", "peak TFLOP/s"):
            t.add_column(col)
        for r in rows:
            peaks = ", ".join(f"{k} {v:g}" for k, v in r["peak_tflops"].items())
            t.add_row(r["name"], ", ".join(r["aliases"]), r["gpu"], str(r["gpus_per_node"]), str(r["nvlink_domain"]),
                      f"{r['hbm_gib']:g}", peaks)
        console.print(readable(t, names=("name", "GPU")))

    @model_app.command("show")
    def model_show(
        name: Annotated[str, typer.Argument(help="Catalog name/alias, or a path to a Hugging Face config.json.")],
        json_out: JsonOpt = False,
    ) -> None:
        """Architecture and parameter counts (total, active per token, by component)."""
        from rich.table import Table

        from moetune.catalog.models import get_model

        d = model_detail(get_model(name))
        if json_out:
            print_json(d)
            return
        t = Table(title=f"{d['name']}", show_header=False)
        t.add_column("field")
        t.add_column("value")
        keys = ("family", "hf_id", "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                "num_query_groups", "kv_channels", "vocab_size", "padded_vocab_size", "multi_latent_attention",
                "q_lora_rank", "kv_lora_rank", "num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size",
                "moe_shared_expert_intermediate_size", "moe_latent_size", "window_size", "mtp_num_layers",
                "mixer_pattern", "mlp_pattern", "source")
        for k in keys:
            if d.get(k) not in (None, False):
                t.add_row(k, str(d[k]))
        t.add_row("total params", f"{d['total_params']:,} ({_b(d['total_params'])})")
        t.add_row("active params / token", f"{d['active_params']:,} ({_b(d['active_params'])})")
        for k, v in d["params_by_component"].items():
            if v:
                t.add_row(f"  {k}", f"{v:,}")
        console.print(readable(t, names=("field",)))

    app.add_typer(catalog, name="catalog")
    app.add_typer(model_app, name="model")
