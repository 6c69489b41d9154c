"""``moetune sweep collect``: read every run's logs and traces with the evidence readers, apply acceptance, pick the
winner per phase, and record predicted vs measured for every run.

Acceptance (docs/domain.md §7.1-7.2, seeds S:wf/S:rec): a log exists; loss finite with zero NaN and zero skipped
iterations; the declared steady window is present in the log; the contract is unchanged (contract.yaml hash, the
run's manifest, observed GBS/config vs the contract, exactly one variable changed for a retune run); and the intended
dispatcher backend / CUDA graphs / FP8 are proven active (dispatcher kernels in the trace and no fallback in the log —
a config dump is not proof). A run that fails any check is rejected with the reasons; a check without evidence either
way is 'unverified' (reported; the run can still win only if nothing contradicts it).

Winner per phase: the fastest accepted run by steady-window step time, kept only when the A/B verdict against the
phase reference is an improvement beyond noise (``compare_runs``' bootstrap interval); otherwise the reference stays.
Outputs: ``collect/results.json``, ``collect/runs.csv`` (every run, predicted vs measured, with the columns of
``data/perf/mbridge_perf_calibration.csv`` plus predicted/measured pairs and acceptance) and
``collect/calibration.csv`` (the accepted runs with a measured model TFLOP/s: the input of ``moetune calibrate``).
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from moetune.sweep.contract import file_sha256
from moetune.sweep.evidence import (
    compare,
    peak_memory_gib,
    read_log_evidence,
    read_trace_evidence,
    run_logs,
    run_traces,
)
from moetune.sweep.sweepdir import load_run, load_sweep

PASS, FAIL, UNVERIFIED = "pass", "fail", "unverified"

#: fallback/skip messages that show a flex backend did not run (docs/domain.md §7.4 'silently skipped')
FALLBACK_SIGNALS = ("dispatcher_fallback", "deepep_unavailable", "hybridep_unavailable", "flex_fallback")

CALIBRATION_COLUMNS = ["release", "model", "task", "system", "num_gpus", "precision", "gbs", "mbs", "seq_len", "tp",
                       "pp", "cp", "vp", "ep", "etp", "tokens_per_sec_per_gpu", "model_tflops_per_gpu", "source_file",
                       "fsdp", "ga", "model_family", "is_moe", "notes", "status"]
EXTRA_COLUMNS = ["run", "phase", "variable", "accepted", "reasons", "dispatcher", "recompute_modules",
                 "cuda_graph_scope", "step_time_s", "peak_mem_gib", "predicted_step_time_s",
                 "predicted_tokens_per_sec_per_gpu", "predicted_model_tflops_per_gpu", "predicted_peak_gib",
                 "step_time_error_pct"]
PRECISION_LABEL = {"bf16": "BF16", "fp16": "FP16", "fp8_cs": "FP8-CS", "fp8_delayed": "FP8-DS",
                   "fp8_blockwise": "FP8-SC", "mxfp8": "MXFP8", "nvfp4": "NVFP4"}


def _check(name: str, status: str, reason: str = "", **evidence: Any) -> dict[str, Any]:
    return {"check": name, "status": status, "reason": reason, **({"evidence": evidence} if evidence else {})}


def _get(contract, section: str, attr: str):
    return getattr(getattr(contract, section), attr, None)


def _dispatcher_check(intended: str, log: dict | None, trace: dict | None, trace_error: str | None) -> dict:
    fallback = [s for s in (log or {}).get("signals", []) if any(k in str(s.get("kind", "")).lower()
                                                                  for k in FALLBACK_SIGNALS)]
    if fallback:
        s = fallback[0]
        return _check("dispatcher_active", FAIL, f"intended {intended} but the log shows a fallback at line "
                      f"{s.get('line')}: {s.get('text', '')[:160]}")
    stated = str((log or {}).get("observed", {}).get("dispatcher") or "")
    if stated:
        stated_name = stated.split(":", 1)[-1]
        if stated_name != intended and not (intended == "alltoall" and stated_name == "alltoall"):
            return _check("dispatcher_active", FAIL, f"intended {intended} but the log's config runs {stated}")
    if intended in ("deepep", "hybridep"):
        if trace is None:
            why = trace_error or "no trace for this run"
            return _check("dispatcher_active", UNVERIFIED, f"intended {intended}: {why}; a config dump is not proof")
        if intended not in trace["backends"]:
            seen = ", ".join(trace["backends"]) or "no communication kernels"
            return _check("dispatcher_active", FAIL, f"intended {intended} but the trace has no {intended} kernels "
                          f"(saw: {seen})", backends=trace["backends"])
        return _check("dispatcher_active", PASS, f"{intended} kernels in the trace", backends=trace["backends"])
    if trace is not None and ({"deepep", "hybridep"} & set(trace["backends"])):
        return _check("dispatcher_active", FAIL, f"intended {intended} but the trace shows "
                      f"{', '.join(sorted({'deepep', 'hybridep'} & set(trace['backends'])))} kernels")
    if trace is not None:
        return _check("dispatcher_active", PASS, f"{intended}: no flex-backend kernels, as intended",
                      backends=trace["backends"])
    return _check("dispatcher_active", UNVERIFIED, f"intended {intended}: no trace for this run")


def _jobs(d: Path) -> dict[str, str]:
    from moetune.sweep.sweepdir import read_jobs

    return read_jobs(d)


def _submitted(d: Path, name: str) -> bool:
    return name in _jobs(d)


def _not_run_yet(d: Path, name: str) -> bool:
    """No job id in ``jobs.json`` (never submitted), or a job Slurm still lists as pending/running."""
    job = _jobs(d).get(name)
    if job is None:
        return True
    try:
        from moetune.sweep.status import FINAL_STATES, job_states

        state = job_states([job]).get(job, {}).get("state")
    except Exception:  # noqa: BLE001 - no Slurm client here: judge by the output alone
        return False
    return state is not None and state not in FINAL_STATES and state != "UNKNOWN"


def evaluate_run(d: Path, sweep: dict, contract, contract_ok: bool, run_entry: dict, *,
                 trace_workers: int | None = None) -> dict[str, Any]:
    """Acceptance checks and measurements of one run."""
    man = load_run(d, run_entry["name"])
    rdir = d / run_entry["dir"]
    w = man["window"]
    window = (int(w["first"]), int(w["last"]))
    checks: list[dict] = []
    res: dict[str, Any] = {"run": man["name"], "phase": man["phase"], "variable": man.get("variable"),
                           "change": man.get("change") or {}, "reference": man.get("reference"),
                           "window": [window[0], window[1]], "predicted": man.get("predicted") or {},
                           "layout": man["layout"], "mbs": man["mbs"], "precision": man["precision"],
                           "features": man["features"], "gpus": man["gpus"], "notes": man.get("notes") or [],
                           "intended": man.get("intended") or {}, "replay": man.get("replay")}
    logs = run_logs(rdir)
    traces = run_traces(rdir)
    res["logs"] = [str(p) for p in logs]
    res["traces"] = [str(p) for p in traces]
    log = None
    if not logs:
        checks.append(_check("log_present", FAIL, f"no training log in {rdir / 'logs'} (job not run or failed early)"))
    else:
        try:
            log = read_log_evidence(logs[0], window, gpus=man["gpus"], seq_length=contract.shape.seq_length,
                                    global_batch_size=contract.shape.global_batch_size)
            checks.append(_check("log_present", PASS, logs[0].name))
        except Exception as exc:  # a reader error on this file rejects the run with the reader's message
            checks.append(_check("log_present", FAIL, f"{logs[0].name}: {' '.join(str(exc).split())[:200]}"))
    if log is not None:
        nan = log["nan_iterations"] or 0
        nan_list = list(nan) if isinstance(nan, list | tuple) else []
        n_nan = len(nan_list) if nan_list else int(nan or 0)
        finite = log["loss_finite"]
        if finite is False or n_nan:
            at = f" at iteration {', '.join(str(i) for i in nan_list[:5])}" if nan_list else ""
            checks.append(_check("loss_finite", FAIL, f"non-finite loss: {n_nan} NaN iteration(s){at}"
                                 f"{' (loss missing or NaN in the log)' if finite is False else ''}"))
        elif finite is None:
            checks.append(_check("loss_finite", UNVERIFIED, "the log reader reported no loss health"))
        else:
            checks.append(_check("loss_finite", PASS, "finite loss, 0 NaN iterations"))
        sk = log["skipped_iterations"] or 0
        sk = len(sk) if isinstance(sk, list | tuple) else int(sk)
        checks.append(_check("no_skipped", FAIL if sk else PASS, f"{sk} skipped iteration(s)"))
        its = log["iterations"]
        have = [i for i in its if window[0] <= i <= window[1]]
        if its and min(its) <= window[0] and max(its) >= window[1] and len(have) >= min(3, window[1] - window[0] + 1):
            checks.append(_check("steady_window", PASS, f"iterations {window[0]}-{window[1]}: {len(have)} samples"))
        else:
            span = f"{min(its)}-{max(its)}" if its else "none"
            checks.append(_check("steady_window", FAIL, f"declared window {window[0]}-{window[1]} not in the log "
                                 f"(iterations seen: {span})"))
        tflops = log["tflops_per_gpu"]
        tflops_source = "log"
        if tflops is None and log["tokens_per_s_per_gpu"]:
            tflops = _model_tflops(contract, man, log["tokens_per_s_per_gpu"])
            tflops_source = "tokens/s x Bridge FLOPs/token"
        res.update(step_time_s=log["step_time_s"], tokens_per_s_per_gpu=log["tokens_per_s_per_gpu"],
                   tflops_per_gpu=tflops, tflops_source=tflops_source, peak_mem_gib=peak_memory_gib(log["memory"]),
                   window_step_s=log["window_step_s"], log_source=log["source"], versions=log["versions"],
                   evidence_notes=log["notes"])
    # contract
    broken = []
    if not contract_ok:
        broken.append("contract.yaml was edited after the sweep was generated (hash differs from sweep.yaml)")
    if man.get("contract_sha256") != sweep.get("contract_sha256"):
        broken.append("run manifest was generated under a different contract")
    if man.get("reference"):
        extra = _undeclared_changes(man, load_run(d, man["reference"]))
        if extra:
            broken.append(f"changes beyond the declared variable vs {man['reference']}: {', '.join(extra)}")
    if log is not None:
        obs = log["observed"]
        for key, want in _intended_contract(man, contract).items():
            got = obs.get(key)
            if got is None or want is None:
                continue
            try:
                differs = int(got) != int(want)
            except (TypeError, ValueError):
                differs = str(got) != str(want)
            if differs:
                what = key.replace("_", " ")
                broken.append(f"{what} {got} in the log vs {want} in the contract")
    checks.append(_check("contract", FAIL if broken else PASS, "; ".join(broken) or "contract held"))
    # features actually active
    trace = None
    trace_error = None
    if traces:
        try:
            trace = read_trace_evidence(traces, workers=trace_workers)
            res["trace"] = {k: v for k, v in trace.items() if k != "report"}
            res["trace_report"] = trace["report"]
        except Exception as exc:
            trace_error = f"trace unreadable: {' '.join(str(exc).split())[:200]}"
    intended = res["intended"]
    checks.append(_dispatcher_check(str(intended.get("dispatcher", "alltoall")), log, trace, trace_error))
    if intended.get("cuda_graphs"):
        if trace is None:
            checks.append(_check("cuda_graphs_active", UNVERIFIED, "graphs intended; no trace to show replays"))
        else:
            checks.append(_check("cuda_graphs_active", PASS if trace["cuda_graphs"] else FAIL,
                                 "graph replays in the trace" if trace["cuda_graphs"] else
                                 "graphs intended but no cudaGraphLaunch/replayed kernels in the trace"))
    if str(intended.get("precision", "bf16")) not in ("bf16", "fp16"):
        if trace is None:
            checks.append(_check("precision_active", UNVERIFIED, f"{intended['precision']} intended; no trace"))
        else:
            checks.append(_check("precision_active", PASS if trace["fp8"] else FAIL,
                                 "FP8/FP4 kernels in the trace" if trace["fp8"] else
                                 f"{intended['precision']} intended but no FP8/FP4 GEMM or cast kernels in the trace"))
    res["checks"] = checks
    res["accepted"] = all(c["status"] != FAIL for c in checks) and any(
        c["check"] == "log_present" and c["status"] == PASS for c in checks)
    res["reasons"] = [c["reason"] for c in checks if c["status"] == FAIL]
    # a run with no output that was never submitted (or whose job has not finished) is pending, not rejected
    res["status"] = "accepted" if res["accepted"] else "rejected"
    other_failures = [c for c in checks if c["status"] == FAIL and c["check"] not in ("log_present", "dispatcher_active")]
    if not logs and not traces and not other_failures and _not_run_yet(d, man["name"]):
        res["status"] = "pending"
        res["reasons"] = ["not run yet (no log; " + ("not submitted)" if not _submitted(d, man["name"])
                                                     else "job not finished)")]
    res["unverified"] = [c["reason"] for c in checks if c["status"] == UNVERIFIED]
    res["_record"] = log["record"] if log else None
    return res


def _model_tflops(contract, man: dict, tokens_per_s_per_gpu: float) -> float | None:
    """Model TFLOP/s/GPU = tokens/s/GPU x model FLOPs per token (Bridge ``num_floating_point_operations``
    definition, ``moetune.perfmodel.flops.flops_per_token``) / 1e12."""
    from moetune.perfmodel.flops import flops_per_token

    try:
        fpt = flops_per_token(contract.arch(), contract.shape.seq_length, tp=int(man["layout"].get("tp") or 1)).total
    except Exception:  # a model the FLOPs counter cannot describe: leave TFLOP/s unknown
        return None
    return tokens_per_s_per_gpu * fpt / 1e12


def _undeclared_changes(man: dict, ref: dict) -> list[str]:
    """Fields where a run differs from its reference but that its declared change does not name."""
    declared = {k.split(".", 1)[1] if k.startswith("layout.") else k for k in (man.get("change") or {})}
    out = []
    for key in sorted(set(man["features"]) | set(ref["features"])):
        if man["features"].get(key) != ref["features"].get(key) and key not in declared:
            out.append(key)
    for key in sorted(set(man["layout"]) | set(ref["layout"])):
        if man["layout"].get(key) != ref["layout"].get(key) and key not in declared:
            out.append(f"layout.{key}")
    if man["mbs"] != ref["mbs"] and "mbs" not in declared:
        out.append("mbs")
    if man["precision"] != ref["precision"] and "precision" not in declared:
        out.append("precision")
    return out


def _intended_contract(man: dict, contract) -> dict[str, Any]:
    """Contract field (names of ``moetune.evidence.contract.FIELDS``) -> the value this run must show."""
    lay = man["layout"]
    return {"global_batch_size": contract.shape.global_batch_size, "seq_length": contract.shape.seq_length,
            "micro_batch_size": man["mbs"], "gpus": man["gpus"], "tp": lay.get("tp"), "pp": lay.get("pp"),
            "cp": lay.get("cp"), "ep": lay.get("ep"), "etp": lay.get("etp")}


def _ab(ref: dict, cand: dict, efficiency: Any = None) -> dict[str, Any]:
    row = {"a": ref["run"], "b": cand["run"], "variable": cand.get("variable"), "change": cand.get("change"),
           "a_step_time_s": ref.get("step_time_s"), "b_step_time_s": cand.get("step_time_s")}
    if not ref["accepted"] or not cand["accepted"]:
        bad = cand if not cand["accepted"] else ref
        row.update(verdict="not_comparable", reason=f"{bad['run']} rejected: " + "; ".join(bad["reasons"]))
        return row
    try:
        cmp = compare(ref["_record"], cand["_record"], tuple(cand["window"]), efficiency=efficiency)
    except Exception as exc:
        row.update(verdict="unavailable", reason=f"compare failed: {' '.join(str(exc).split())[:160]}")
        return row
    contract = cmp.get("contract") or {}
    row.update(verdict=cmp.get("verdict"), delta_pct=cmp.get("delta_pct"), ci_pct=cmp.get("ci_pct"),
               contract_ok=contract.get("ok", True), contract_violations=contract.get("violations", []))
    if contract and contract.get("ok") is False:
        allowed = set(cand.get("change") or {})
        others = [v for v in contract.get("violations", []) if not any(a.split(".")[-1] in str(v) for a in allowed)]
        if others:
            row.update(verdict="not_comparable", reason="contract broken: " + "; ".join(map(str, others)))
    return row


def _winner(results: list[dict], phase: str, abs_: list[dict], sweep_candidate: int = 0, efficiency: Any = None
            ) -> dict[str, Any] | None:
    rows = [r for r in results if r["phase"] == phase]
    if not rows:
        return None
    acc = [r for r in rows if r["accepted"] and r.get("step_time_s")]
    if not acc:
        return {"phase": phase, "run": None, "reason": "no accepted run"}
    if phase == "retune":
        better = [a for a in abs_ if a.get("verdict") == "improvement"]
        if better:
            best = min(better, key=lambda a: a.get("delta_pct") if a.get("delta_pct") is not None else 0.0)
            ci = best.get("ci_pct") or []
            ci_s = f" (CI {ci[0]:+.1f} .. {ci[1]:+.1f} %)" if len(ci) == 2 else ""
            return {"phase": phase, "run": best["b"], "reason": f"improvement beyond noise vs {best['a']}: "
                    f"{best.get('delta_pct'):+.1f} %{ci_s}"}
        ref = next((r for r in acc if r["run"] == "retune-ref"), None)
        return {"phase": phase, "run": ref["run"] if ref else None,
                "reason": "no candidate beat the reference beyond noise"}
    best = min(acc, key=lambda r: r["step_time_s"])
    base = next((r for r in acc if r["run"] in (f"{phase}-base", f"{phase}-c{sweep_candidate}")), None)
    if phase == "scale" and base is not None and best is not base:
        row = _ab(base, best, efficiency)
        if row.get("verdict") != "improvement":
            return {"phase": phase, "run": base["run"], "reason": f"{best['run']} is not faster beyond noise "
                    f"({row.get('verdict')}: {row.get('delta_pct')} %); keep the planner's choice"}
        return {"phase": phase, "run": best["run"], "reason": f"faster than {base['run']} beyond noise: "
                f"{row.get('delta_pct'):+.1f} % (CI {row.get('ci_pct')})"}
    return {"phase": phase, "run": best["run"], "reason": f"fastest accepted steady-window step time "
            f"{best['step_time_s']:.4g} s"}


def _calibration_rows(results: list[dict], contract, sweep: dict) -> list[dict[str, Any]]:
    rows = []
    for r in results:
        lay = r["layout"]
        pred = r.get("predicted") or {}
        st = r.get("step_time_s")
        pst = pred.get("step_time_s")
        err = (100.0 * (pst - st) / st) if (st and pst) else None
        rows.append({
            "release": contract.versions.container, "model": contract.model, "task": "pretrain",
            "system": contract.hardware.system, "num_gpus": r["gpus"],
            "precision": PRECISION_LABEL.get(r["precision"], r["precision"]),
            "gbs": contract.shape.global_batch_size, "mbs": r["mbs"], "seq_len": contract.shape.seq_length,
            "tp": lay.get("tp", 1), "pp": lay.get("pp", 1), "cp": lay.get("cp", 1), "vp": lay.get("vpp") or "",
            "ep": lay.get("ep", 1), "etp": lay.get("etp") if lay.get("etp") is not None else "",
            "tokens_per_sec_per_gpu": _fmt(r.get("tokens_per_s_per_gpu")),
            "model_tflops_per_gpu": _fmt(r.get("tflops_per_gpu")),
            "source_file": f"sweep:{sweep['name']}/{r['run']}", "fsdp": "", "ga": "",
            "model_family": sweep.get("model_info", {}).get("name", contract.model), "is_moe": "yes",
            "notes": contract.semantics.label, "status": r.get("status") or ("accepted" if r["accepted"] else "rejected"),
            "run": r["run"], "phase": r["phase"], "variable": r.get("variable") or "",
            "accepted": r["accepted"], "reasons": " | ".join(r["reasons"]),
            "dispatcher": r["intended"].get("dispatcher", ""),
            "recompute_modules": ",".join(r["features"].get("recompute_modules") or []),
            "cuda_graph_scope": ",".join(r["features"].get("cuda_graph_scope") or []),
            "step_time_s": _fmt(st), "peak_mem_gib": _fmt(r.get("peak_mem_gib")),
            "predicted_step_time_s": _fmt(pst),
            "predicted_tokens_per_sec_per_gpu": _fmt(pred.get("tokens_per_s_per_gpu")),
            "predicted_model_tflops_per_gpu": _fmt(pred.get("tflops_per_gpu")),
            "predicted_peak_gib": _fmt(pred.get("peak_gib")), "step_time_error_pct": _fmt(err),
        })
    return rows


def _fmt(x: Any) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return ""
    return f"{x:.6g}" if isinstance(x, float) else str(x)


def _regenerate_validate(d: Path, sweep: dict, contract, winners: list[dict], by_name: dict) -> str:
    """Point the validation run at the retune winner (before it ran) or say that it validated something else."""
    from moetune.sweep.contract import Window
    from moetune.sweep.phases import RunSpec, intended_features
    from moetune.sweep.sweepdir import write_run

    win = next((w.get("run") for w in winners if w["phase"] == "retune"), None)
    val = by_name.get("validate-winner")
    if not win or val is None or win == "retune-ref":
        return "validation runs the reference configuration"
    src = load_run(d, win)
    man = load_run(d, "validate-winner")
    same = src["features"] == man["features"] and src["layout"] == man["layout"] and src["mbs"] == man["mbs"] \
        and src["precision"] == man["precision"]
    if same:
        return f"validation runs the retune winner {win}"
    name = "validate-winner"
    if val["logs"]:
        # the declared validation already ran another configuration: add a new validation run for the winner
        name = f"validate-{win.removeprefix('retune-')}"
        if any(r["name"] == name for r in sweep["runs"]):
            return f"validation of the retune winner {win} is run {name}"
    spec = RunSpec(name=name, phase="validate", layout=src["layout"], mbs=src["mbs"],
                   features=src["features"], precision=src["precision"], gpus=src["gpus"],
                   window=Window(**man["window"]), candidate_index=man.get("candidate_index"),
                   predicted=man.get("predicted") or {}, notes=[*man.get("notes", []), f"retune winner {win}"],
                   intended=intended_features(src["features"], src["precision"]))
    write_run(d, contract, sweep["contract_sha256"], spec, man.get("replay"), sweep["name"])
    if name != "validate-winner":
        import yaml

        entry = next(r for r in sweep["runs"] if r["name"] == "validate-winner")
        sweep["runs"].append({**entry, "name": name, "dir": f"runs/{name}", "depends": {"type": "afterany", "on": []}})
        from moetune.files import write_atomic

        write_atomic(d / "sweep.yaml", yaml.safe_dump(sweep, sort_keys=False))
        return (f"validate-winner validated the reference configuration; added run {name} for the retune winner "
                f"{win}: `moetune sweep submit {d} --run {name}`")
    return f"validate-winner regenerated with the retune winner {win}; submit it with --phase validate"


def collect_sweep(d: Path, *, efficiency: Any = None, trace_workers: int | None = None) -> dict[str, Any]:
    """Judge every run of the sweep in ``d``, pick the winners, write collect/. ``efficiency``: the time model's
    parameters that rank A/B differences; ``trace_workers``: processes that read Kineto traces."""
    sweep, contract = load_sweep(d)
    contract_ok = file_sha256(d / "contract.yaml") == sweep.get("contract_sha256")
    results = [evaluate_run(d, sweep, contract, contract_ok, r, trace_workers=trace_workers) for r in sweep["runs"]]
    by_name = {r["run"]: r for r in results}
    abs_ = [_ab(by_name[r["reference"]], r, efficiency) for r in results
            if r["phase"] == "retune" and r.get("reference") in by_name]
    winners = [w for p in ("fit", "scale", "profile", "retune", "validate")
               if (w := _winner(results, p, abs_, int(sweep.get("candidate", 0)), efficiency)) is not None]
    validate_note = _regenerate_validate(d, sweep, contract, winners, by_name)
    out_dir = d / "collect"
    out_dir.mkdir(exist_ok=True)
    rows = _calibration_rows(results, contract, sweep)
    from moetune.files import write_atomic

    def _csv(selected) -> str:
        buf = io.StringIO(newline="")
        wr = csv.DictWriter(buf, fieldnames=CALIBRATION_COLUMNS + EXTRA_COLUMNS)
        wr.writeheader()
        wr.writerows(selected)
        return buf.getvalue()

    # every run, predicted vs measured (rejected runs with their reasons); each file replaced atomically
    write_atomic(out_dir / "runs.csv", _csv(rows))
    # what `moetune calibrate` fits from: accepted runs with a measured model TFLOP/s
    write_atomic(out_dir / "calibration.csv", _csv(r for r in rows if r["accepted"] and r["model_tflops_per_gpu"]))
    public = [{k: v for k, v in r.items() if not k.startswith("_")} for r in results]
    doc = {"sweep": sweep["name"], "contract_ok": contract_ok, "contract": contract.model_dump(mode="json",
                                                                                             by_alias=True),
           "runs": public, "ab": abs_, "winners": winners, "validate": validate_note,
           "accepted": sum(r["accepted"] for r in results),
           "rejected": sum(r.get("status") == "rejected" for r in results),
           "pending": sum(r.get("status") == "pending" for r in results),
           "calibration_csv": str(out_dir / "calibration.csv"), "runs_csv": str(out_dir / "runs.csv")}
    write_atomic(out_dir / "results.json", json.dumps(doc, indent=1, default=str))
    return doc
