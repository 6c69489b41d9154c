"""``moetune flops``: model FLOPs per token and per step, Megatron-Bridge's model-TFLOP/s definition."""

from dataclasses import asdict
from typing import Annotated

import typer

from moetune.output import console, print_json, readable


def register(app: typer.Typer) -> None:
    @app.command("flops")
    def flops(
        model: Annotated[str, typer.Option("--model", "-m", help="Catalog name/alias or HF config.json path.")],
        seq: Annotated[int, typer.Option("--seq", help="Sequence length (tokens per sample).")],
        gbs: Annotated[int | None, typer.Option("--gbs", help="Global batch size (samples per step).")] = None,
        tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel size (only pads the vocab).")] = 1,
        definition: Annotated[str, typer.Option("--definition",
                                                help="'current' Bridge formula or 'legacy' (releases < 26.06).")
                              ] = "current",
        json_out: Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")] = False,
    ) -> None:
        """Model FLOPs per token and per step (forward + backward, Bridge num_floating_point_operations)."""
        from rich.table import Table

        from moetune.catalog.models import get_model
        from moetune.errors import InputError
        from moetune.perfmodel.flops import flops_per_step, flops_per_token

        if tp < 1:
            raise InputError.bad_value("--tp", tp, "a positive integer")
        arch = get_model(model)
        f = flops_per_token(arch, seq, tp, definition)
        per_step = flops_per_step(arch, seq, gbs, tp, definition) if gbs is not None else None
        out = {
            "model": arch.name,
            "seq_length": seq,
            "global_batch_size": gbs,
            "tp": tp,
            "flops_per_token": f.total,
            "flops_per_step": per_step,
            "breakdown_per_token": {k: v for k, v in asdict(f).items()
                                    if k not in ("total", "seq_length", "tp", "formula", "definition",
                                                 "assumptions")},
            "formula": f.formula,
            "definition": f.definition,
            "assumptions": list(f.assumptions),
        }
        if json_out:
            print_json(out)
            return
        t = Table(title=f"{arch.name}: model FLOPs (s={seq}, {f.formula}, {f.definition})", show_header=True)
        t.add_column("component")
        t.add_column("FLOPs / token", justify="right")
        t.add_column("share", justify="right")
        for k, v in out["breakdown_per_token"].items():
            if v:
                t.add_row(k, f"{v:.4e}", f"{100 * v / f.total:.1f} %")
        t.add_row("[bold]total[/]", f"[bold]{f.total:.4e}[/]", "100 %")
        console.print(readable(t, names=("component",)))
        if per_step is not None:
            console.print(f"per step (GBS={gbs} x {seq} tokens): {per_step:.4e} FLOPs")
        for a in f.assumptions:
            console.print(f"[dim]- {a}[/]")
