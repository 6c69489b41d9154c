"""``moetune calibrate FILE.csv``: fit the step-time model's efficiency parameters to measured runs.

The CSV has the columns of ``data/perf/mbridge_perf_calibration.csv`` (model, system, num_gpus, precision,
gbs, mbs, seq_len, tp, pp, cp, vp, ep, model_tflops_per_gpu; optional etp, fsdp, release, status). Features not in
the CSV come from the Megatron-Bridge perf recipe for that model/system/precision when one exists. The fitted file
is the format of ``moetune/catalog/efficiency.yaml`` (the fit starts from the documented priors, so on the shipped
``data/perf/mbridge_perf_calibration.csv`` it reproduces the shipped catalog); pass it back with ``--efficiency FILE`` (or the
``MOETUNE_EFFICIENCY`` environment variable).
"""

from pathlib import Path
from typing import Annotated

import typer

from moetune.output import console, err_console, print_json, readable


def register(app: typer.Typer) -> None:
    @app.command("calibrate")
    def calibrate(
        csv_file: Annotated[Path, typer.Argument(help="Measured runs, with the columns of the shipped data/perf/mbridge_perf_calibration.csv "
                                           "(e.g. moetune calibrate data/perf/mbridge_perf_calibration.csv).")],
        out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the fitted efficiency YAML here.")] = None,
        params: Annotated[str | None, typer.Option(
            "--params", help="Comma-separated parameter names to fit (default: all); others keep their values.")
        ] = None,
        efficiency: Annotated[Path | None, typer.Option(
            "--efficiency", help="Start from this efficiency file instead of the shipped one.")] = None,
        max_nfev: Annotated[int | None, typer.Option(
            "--max-evals", help="Fit budget (model evaluations per parameter; default: enough to converge).")
                            ] = None,
        json_out: Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")] = False,
    ) -> None:
        """Fit the few efficiency parameters (GEMM/attention/HBM/link fractions, launch cost) to measured runs."""
        import numpy as np

        from moetune.errors import InputError
        from moetune.io.load import build_published_job
        from moetune.perfmodel.calibration import (
            NFEV_PER_PARAM,
            RunPredictor,
                    fit_runs,
            load_efficiency,
            read_measured_csv,
            save_efficiency,
        )

        base = load_efficiency(efficiency)
        if out is not None:
            from moetune.files import check_writable

            check_writable([out])  # fail before the fit, not after it
        names = None
        if params:
            names = [p.strip() for p in params.split(",") if p.strip()]
            bad = [n for n in names if n not in base.specs]
            if bad:
                raise InputError.bad_value("--params", ",".join(bad), f"names among {', '.join(base.specs)}")
        if max_nfev is not None and max_nfev < 1:
            raise InputError.bad_value("--max-evals", max_nfev, "a positive integer")
        runs, skipped = read_measured_csv(csv_file, job_builder=build_published_job)
        if not runs:
            raise InputError(f"{csv_file}: no usable rows ({len(skipped)} skipped: "
                             f"{skipped[0] if skipped else 'empty file'})", field="csv")
        meas = np.array([r.tflops for r in runs])
        if not np.all(np.isfinite(meas)) or np.any(meas <= 0):
            raise InputError(f"{csv_file}: model_tflops_per_gpu must be positive numbers", field="csv")
        predict = RunPredictor(runs, base)
        before = predict(base)
        res = fit_runs(predict, base, names=names, nfev_per_param=max_nfev or NFEV_PER_PARAM)
        after = predict(res.efficiency)

        def stats(pred):
            e = np.abs(pred / meas - 1) * 100
            return {"median_abs_err_pct": float(np.median(e)), "p90_abs_err_pct": float(np.percentile(e, 90))}

        info = {"method": "moetune.perfmodel.calibration.fit_runs: scipy.optimize.least_squares on "
                          "log(pred/measured) from the documented priors, soft-L1, weak prior",
                "data": f"{csv_file.name}: {len(runs)} runs, {len(skipped)} rows skipped",
                "fitted": res.fitted, "before": stats(before), "after": stats(after)}
        eff = res.efficiency.with_values({}, origin=str(out) if out else "calibrate (not saved)", fit_info=info)
        if out is not None:
            save_efficiency(eff, out)
        result = {
            "runs": len(runs), "skipped": skipped, "params": {k: eff.values[k] for k in eff.names},
            "fit": info, "out": str(out) if out else None,
            "rows": [{"row": r.label, "measured_tflops": r.tflops, "predicted_tflops": float(p),
                      "error_pct": float((p / r.tflops - 1) * 100)} for r, p in zip(runs, after, strict=True)],
        }
        if json_out:
            print_json(result)
            return
        from rich.table import Table

        tab = Table(title="fitted efficiency parameters", box=None, header_style="bold")
        tab.add_column("parameter")
        tab.add_column("before", justify="right")
        tab.add_column("after", justify="right")
        for k in eff.names:
            mark = "" if k in res.fitted else " (kept)"
            tab.add_row(k + mark, f"{base.values[k]:.4g}", f"{eff.values[k]:.4g}")
        console.print(readable(tab, names=("parameter",)))
        b, a = info["before"], info["after"]
        console.print(f"{len(runs)} runs ({len(skipped)} rows skipped); |error| median {b['median_abs_err_pct']:.1f}% "
                      f"-> {a['median_abs_err_pct']:.1f}%, p90 {b['p90_abs_err_pct']:.1f}% -> "
                      f"{a['p90_abs_err_pct']:.1f}%")
        if out is not None:
            console.print(f"wrote {out}  (use: moetune estimate ... --efficiency {out})")
        else:
            err_console.print("[dim]not saved: pass --out FILE to write the fitted parameters[/]")
