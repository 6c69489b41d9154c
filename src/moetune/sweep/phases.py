"""Phase generation: fit, scale, profile, retune (one variable changed per run), validate.

Order and rules from the seeds' workflow (docs/domain.md §6.1): freeze the contract; fit with minimal model
parallelism; scale (compare the planner's layouts at the full world size); profile the chosen layout; retune one
variable at a time — dispatcher backends (§6.2), EP overlap and delayed wgrad as its own candidate (§6.3),
recompute sets, CUDA-graph scopes and the precision recipe (§6.4), VPP/layout alternatives from the planner; validate
the winner for >= 50 steps with a declared window (§7.1). Dispatcher, overlap, precision, graphs and recompute are
candidates to test, not hardware defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from moetune.spec.layout import bridge_default_etp
from moetune.spec.validate import min_world_size_of
from moetune.sweep.contract import Contract, Window
from moetune.sweep.plan_input import Candidate

PHASES = ("fit", "scale", "profile", "retune", "validate")


@dataclass
class RunSpec:
    """One job of the sweep."""

    name: str
    phase: str
    layout: dict[str, Any]
    mbs: int
    features: dict[str, Any]
    precision: str
    gpus: int
    window: Window
    variable: str | None = None            # what this run changes (retune), e.g. 'dispatcher'
    change: dict[str, Any] = field(default_factory=dict)   # the changed fields and their new values
    reference: str | None = None           # the run it is compared against (A of the A/B)
    profile: bool = False
    candidate_index: int | None = None
    predicted: dict[str, float | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    intended: dict[str, Any] = field(default_factory=dict)  # what must be proven active


def min_world_size(layout: dict[str, Any]) -> int:
    """Minimum GPUs for a folded layout given as a dict: :func:`moetune.spec.validate.min_world_size_of`
    (``PP x lcm(TP x CP, ETP x EP)``, PAR-004 / TOPO-008), ETP unset -> the Bridge default."""
    tp, pp, cp, ep = (int(layout.get(k) or 1) for k in ("tp", "pp", "cp", "ep"))
    etp = layout.get("etp")
    return min_world_size_of(tp, cp, pp, ep, int(etp) if etp is not None else bridge_default_etp(tp, ep))


def intended_features(features: dict[str, Any], precision: str) -> dict[str, Any]:
    """The features whose activation must be proven from logs/traces (docs/domain.md §7.2 'Proof a feature ran')."""
    out: dict[str, Any] = {"dispatcher": dispatcher_of(features), "precision": precision}
    if features.get("cuda_graph_impl") not in (None, "none"):
        out["cuda_graphs"] = list(features.get("cuda_graph_scope") or [])
    if features.get("overlap_moe_expert_parallel_comm"):
        out["ep_overlap"] = True
    return out


def dispatcher_of(features: dict[str, Any]) -> str:
    """'alltoall', 'allgather', 'deepep' or 'hybridep' (flex is named by its backend)."""
    d = features.get("moe_token_dispatcher_type", "alltoall")
    if d == "flex":
        return str(features.get("moe_flex_dispatcher_backend") or "deepep")
    return str(d)


def _retune_variants(contract: Contract, base: dict[str, Any], model_info: dict[str, Any],
                     alternatives: list[Candidate], base_cand: Candidate) -> list[tuple[str, str, dict, str]]:
    """(name, variable, changed fields, note) for every one-variable retune candidate."""
    out: list[tuple[str, str, dict, str]] = []
    ep = int(contract.layout.ep or 1)
    system = contract.hardware.system.lower()
    arch = model_info.get("arch", "")
    disp = dispatcher_of(base)
    if ep > 1:
        # Dispatcher backends (§6.2). DeepEP: Ampere/Hopper/B200/B300 only — Bridge rejects it on GB200/GB300.
        deepep_ok = not any(s in system for s in ("gb200", "gb300"))
        backends = (["deepep"] if deepep_ok else []) + ["hybridep"]
        for b in backends:
            if disp != b:
                out.append((f"dispatcher-{b}", "dispatcher",
                            {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": b},
                            f"A/B flex/{b} vs {disp} (routing held fixed)"))
        if disp != "alltoall":
            out.append(("dispatcher-alltoall", "dispatcher",
                        {"moe_token_dispatcher_type": "alltoall", "moe_flex_dispatcher_backend": None},
                        "alltoall bring-up reference"))
        # EP overlap first, then delayed wgrad as its own candidate (§6.3)
        if not base.get("overlap_moe_expert_parallel_comm"):
            out.append(("ep-overlap", "ep_overlap", {"overlap_moe_expert_parallel_comm": True,
                                                     "delay_wgrad_compute": False},
                        "plain EP overlap, delay_wgrad off"))
            out.append(("delay-wgrad", "delay_wgrad", {"delay_wgrad_compute": True},
                        "delayed wgrad A/B against the plain-overlap run"))
        elif not base.get("delay_wgrad_compute"):
            out.append(("delay-wgrad", "delay_wgrad", {"delay_wgrad_compute": True}, "delayed wgrad A/B"))
    # Recompute: narrowest boundary first (§6.4)
    mods = list(base.get("recompute_modules") or [])
    if base.get("recompute_granularity") == "full":
        out.append(("recompute-selective", "recompute",
                    {"recompute_granularity": "selective", "recompute_method": None, "recompute_num_layers": None,
                     "recompute_modules": ["moe_act"]}, "full -> selective moe_act"))
    elif mods:
        narrower = mods[:-1]
        out.append(("recompute-narrower", "recompute",
                    {"recompute_granularity": "selective" if narrower else None, "recompute_modules": narrower},
                    f"recompute {mods} -> {narrower or 'none'}"))
    else:
        first = "mla_up_proj" if model_info.get("mla") else "moe_act"
        out.append((f"recompute-{first.replace('_', '-')}", "recompute",
                    {"recompute_granularity": "selective", "recompute_modules": [first]},
                    f"selective recompute {first} (frees memory for a larger MBS/less PP)"))
    # CUDA graphs: dropless MoE -> moe_router + moe_preprocess first (§6.4); none with activation offload
    if base.get("cuda_graph_impl", "none") in (None, "none") and not base.get("fine_grained_activation_offloading"):
        scope = ["moe_router", "moe_preprocess"] if model_info.get("moe", True) else ["attn"]
        out.append(("graphs-" + "-".join(s.replace("_", "") for s in scope), "cuda_graphs",
                    {"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": scope},
                    "partial CUDA graphs; time post-capture steps only"))
    # Precision recipe (§4.3/§6.4): Hopper -> FP8 tensorwise; Blackwell -> MXFP8
    if contract.precision == "bf16":
        target = "mxfp8" if arch == "blackwell" else ("fp8_cs" if arch == "hopper" else None)
        if target:
            out.append((f"precision-{target.replace('_', '')}", "precision", {"precision": target},
                        "precision change is never performance-only: accept only with FP8 kernels in the trace"))
    # Layout alternatives from the planner that differ in exactly one layout dimension (e.g. VPP)
    for alt in alternatives:
        diff = {k: alt.layout.get(k) for k in set(alt.layout) | set(base_cand.layout)
                if alt.layout.get(k) != base_cand.layout.get(k)}
        if alt.mbs != base_cand.mbs:
            diff["mbs"] = alt.mbs
        if len(diff) == 1:
            (k, v), = diff.items()
            out.append((f"layout-{k}{v}", f"layout.{k}", {f"layout.{k}": v},
                        f"planner alternative #{alt.index}: {k} {base_cand.layout.get(k, base_cand.mbs)} -> {v}"))
    return out


def _band(c: Candidate) -> tuple[float, float] | None:
    b = c.time.get("band") if isinstance(c.time, dict) else None
    if isinstance(b, dict) and isinstance(b.get("lo_s"), int | float) and isinstance(b.get("hi_s"), int | float):
        return float(b["lo_s"]), float(b["hi_s"])
    return None


def worth_running(base: Candidate, alternatives: list[Candidate], n: int) -> list[tuple[Candidate, str]]:
    """The base and up to ``n`` alternatives worth a real run, each with the reason.

    An alternative is worth measuring when its prediction band (``time.band`` of ``moetune plan --json``,
    :mod:`moetune.perfmodel.uncertainty`) overlaps the base's: the model cannot tell which is faster, only a run can.
    One whose band lies wholly above the base's is predicted slower beyond the model's error and is not run. Plans
    without bands keep the planner's order."""
    out = [(base, "chosen candidate")]
    bb = _band(base)
    for a in alternatives:
        if len(out) > n:
            break
        ab = _band(a)
        if bb is None or ab is None:
            out.append((a, "planner order (no prediction band in the plan)"))
        elif ab[0] <= bb[1]:
            out.append((a, f"prediction band {ab[0]:.2f}-{ab[1]:.2f} s overlaps the chosen one's "
                           f"{bb[0]:.2f}-{bb[1]:.2f} s: only a run can rank them"))
    return out


def generate_runs(contract: Contract, base: Candidate, alternatives: list[Candidate],
                  model_info: dict[str, Any], *, scale_candidates: int = 3) -> list[RunSpec]:
    """All runs of the sweep, in phase order."""
    runs: list[RunSpec] = []
    feats = dict(contract.features)
    gpus = contract.hardware.gpus
    scr, val = contract.screen, contract.validate_
    pred = base.predicted()

    def spec(name: str, phase: str, **kw: Any) -> RunSpec:
        f = kw.pop("features", feats)
        prec = kw.pop("precision", contract.precision)
        return RunSpec(name=name, phase=phase, layout=kw.pop("layout", dict(base.layout)), mbs=kw.pop("mbs", base.mbs),
                       features=f, precision=prec, gpus=kw.pop("gpus", gpus), window=kw.pop("window", scr),
                       intended=intended_features(f, prec), **kw)

    # fit: the chosen layout on its minimal world size (memory feasibility; not a throughput comparison)
    wmin = min_world_size(base.layout)
    runs.append(spec("fit-base", "fit", gpus=min(wmin, gpus), candidate_index=base.index,
                     notes=[f"minimal world size {wmin} = PP x max(TP x CP, EP x ETP); checks memory, not speed"]))
    # scale: the planner's top candidates at the full world size - those the model cannot rank below the base
    for c, why in worth_running(base, [a for a in alternatives if a.index != base.index],
                                max(scale_candidates - 1, 0)):
        runs.append(spec(f"scale-c{c.index}", "scale", layout=dict(c.layout), mbs=c.mbs,
                         features={**feats, **{k: v for k, v in c.features.items() if k in feats}},
                         candidate_index=c.index, predicted=c.predicted(), notes=[c.label, why]))
    # profile: the chosen layout under the profiler (profiled steps are excluded from timing)
    runs.append(spec("profile-base", "profile", profile=True, candidate_index=base.index, predicted=pred))
    # retune: a reference screen plus one-variable-changed candidates
    runs.append(spec("retune-ref", "retune", candidate_index=base.index, predicted=pred,
                     notes=["reference (A) for every retune A/B"]))
    names = {"retune-ref"}
    for name, variable, change, note in _retune_variants(contract, feats, model_info, alternatives, base):
        layout = dict(base.layout)
        mbs = base.mbs
        f = dict(feats)
        prec = contract.precision
        reference = "retune-ref"
        for k, v in change.items():
            if k.startswith("layout."):
                key = k.split(".", 1)[1]
                if key == "mbs":
                    mbs = v
                else:
                    layout[key] = v
            elif k == "precision":
                prec = v
            else:
                f[k] = v
        if variable == "delay_wgrad" and "retune-ep-overlap" in names:
            reference = "retune-ep-overlap"
            f["overlap_moe_expert_parallel_comm"] = True
        run_name = f"retune-{name}"
        names.add(run_name)
        runs.append(spec(run_name, "retune", layout=layout, mbs=mbs, features=f, precision=prec, variable=variable,
                         change=change, reference=reference, notes=[note]))
    # validate: >= 50 steps with the declared window (regenerated with the retune winner by `sweep collect`)
    runs.append(spec("validate-winner", "validate", window=val, candidate_index=base.index, predicted=pred,
                     notes=[f"declared window {val.label()}"]))
    return runs
