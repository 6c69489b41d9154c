"""``moetune check``: every Megatron-Core / Megatron-Bridge rule (docs/rules.md) on the effective config, with fixes.

Inputs: a Bridge ConfigContainer YAML, a Megatron-LM argument file / functional-test ``model_config.yaml``, a
moetune job JSON, or ``--recipe NAME`` (embedded Bridge perf recipe); Hydra-style ``a.b=c`` overrides after it.
Exit code 1 when an error finding remains, 0 otherwise, 2 for unreadable input.
"""

from pathlib import Path
from typing import Annotated, Any

import typer

from moetune.errors import InputError
from moetune.output import console, print_json

_STYLE = {"error": "bold red", "error-at-build": "red", "error-at-first-step": "red",
          "depends-on-environment": "yellow", "warning": "yellow", "info": "dim"}


def _parse_env(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for it in items:
        if "=" not in it or not it.split("=", 1)[0].strip():
            raise InputError.bad_value("--env", it, "KEY=VALUE")
        k, v = it.split("=", 1)
        out[k.strip()] = v
    return out


def run_check(*, config_file: str | None = None, recipe: str | None = None, megatron_args: str | None = None,
              overrides: list[str] | None = None, system: str | None = None, gpus: int | None = None,
              torch: str | None = None, te: str | None = None, mcore: str | None = None, bridge: str | None = None,
              env: dict[str, str] | None = None, fix: bool = False, with_mcore: bool = False) -> dict[str, Any]:
    """Everything ``moetune check`` prints, as a dict (``findings``, ``effective``; ``fix``/``mcore`` on request)."""
    from moetune.io.check import check_config, resolve_fixes
    from moetune.io.load import load_config
    from moetune.overrides import format_override
    from moetune.rules.engine import Env, gpu_key, public_effective

    cfg = load_config(config_file, recipe, megatron_args, overrides)
    meta = cfg.get("_meta") or {}
    if gpus is not None and gpus < 1:
        raise InputError.bad_value("--gpus", gpus, "a positive integer")
    sysname = system or meta.get("system")
    the_env = Env.for_system(sysname, gpus=gpus or meta.get("gpus"), torch=torch, te=te, mcore=mcore, bridge=bridge,
                             vars=dict(env or {}))
    if system:
        from moetune.catalog.systems import get_system

        get_system(system)  # unknown system -> one-line error naming the closest ones
    if not the_env.gpu and meta.get("gpu"):
        the_env.gpu = gpu_key(meta["gpu"])
    res = check_config(cfg, the_env)
    out: dict[str, Any] = {"findings": [f.as_dict() for f in res.findings],
                           "effective": _clean(public_effective(res.effective))}
    out["_result"] = res
    if fix:
        applied, after = resolve_fixes(cfg, the_env)
        out["fix"] = {"overrides": [format_override(k, v) for k, v in applied.items()],
                      "remaining_errors": [f.id for f in after.errors]}
    if with_mcore:
        from moetune.rules.mcore_check import crosscheck_mcore

        out["mcore"] = crosscheck_mcore(res)
    return out


def _clean(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _clean(v) for k, v in d.items() if not str(k).startswith("_")}
    return d


def _sizes(m: dict[str, Any]) -> str:
    """``TP2 PP4 VPP2 CP1 EP8 ETP1``; VPP only when set; a value that is not a positive integer as ``TP=-4``."""
    out = []
    for tag, key in (("TP", "tensor_model_parallel_size"), ("PP", "pipeline_model_parallel_size"),
                     ("VPP", "virtual_pipeline_model_parallel_size"), ("CP", "context_parallel_size"),
                     ("EP", "expert_model_parallel_size"), ("ETP", "expert_tensor_parallel_size")):
        v = m.get(key)
        if v is None and tag == "VPP":
            continue
        out.append(f"{tag}{v}" if isinstance(v, int) and not isinstance(v, bool) and v > 0 else f"{tag}={v!r}")
    return " ".join(out)


def _render(out: dict[str, Any]) -> None:
    res = out["_result"]
    groups = res.by_severity()
    m = res.effective.get("model", {})
    console.print(f"[bold]effective[/]: {_sizes(m)} dispatcher={m.get('moe_token_dispatcher_type')}"
                  f" ({res.effective.get('frontend')})")
    for note in res.notes:
        console.print(f"  [dim]rewrite {note}[/]")
    for sev, items in groups.items():
        if not items:
            continue
        console.print(f"\n[{_STYLE[sev]}]{sev} ({len(items)})[/]")
        for f in items:
            console.print(f"  [{_STYLE[sev]}]{f.id}[/] {f.message}", highlight=False)
            if f.fix and f.is_error:
                console.print(f"      fix: {' '.join(f'{k}={v}' for k, v in f.fix.items())}", highlight=False)
            console.print(f"      [dim]source: {f.source}[/]", highlight=False)
    n_err = len(res.errors)
    console.print(f"\n{'[bold red]' if n_err else '[bold green]'}{n_err} error(s)[/], "
                  f"{len(groups['depends-on-environment'])} depending on the environment, "
                  f"{len(groups['warning'])} warning(s)")
    if "fix" in out:
        console.print("\n[bold]overrides that resolve the fixable errors:[/]")
        for o in out["fix"]["overrides"]:
            console.print(f"  {o}", highlight=False)
        if out["fix"]["remaining_errors"]:
            console.print(f"  [red]still failing after fixes: {', '.join(out['fix']['remaining_errors'])}[/]")
    if "mcore" in out:
        console.print(f"\n[bold]Megatron-Core cross-check[/]: {out['mcore'].get('summary')}", highlight=False)


def register(app: typer.Typer) -> None:
    @app.command("check", context_settings={"allow_interspersed_args": True})
    def check(
        args: Annotated[list[str] | None, typer.Argument(
            help="CONFIG_FILE (Bridge YAML, Megatron-LM args/model_config.yaml, moetune job JSON) and/or "
                 "Hydra-style overrides like model.expert_model_parallel_size=16", show_default=False)] = None,
        recipe: Annotated[str | None, typer.Option("--recipe", help="Bridge perf recipe name (system/GPUs default "
                                                                     "to the recipe's)")] = None,
        megatron_args: Annotated[str | None, typer.Option("--megatron-args", help="Megatron-LM argument file")] = None,
        system: Annotated[str | None, typer.Option("--system", help="target system (GPU, NVLink domain)")] = None,
        gpus: Annotated[int | None, typer.Option("--gpus", help="world size")] = None,
        torch: Annotated[str | None, typer.Option("--torch", help="PyTorch version")] = None,
        te: Annotated[str | None, typer.Option("--te", help="Transformer Engine version")] = None,
        mcore: Annotated[str | None, typer.Option("--mcore", help="Megatron-Core version")] = None,
        bridge: Annotated[str | None, typer.Option("--bridge", help="Megatron-Bridge version")] = None,
        env: Annotated[list[str] | None, typer.Option("--env", help="KEY=VALUE process env var (repeatable); "
                                                                    "giving any makes the env known")] = None,
        fix: Annotated[bool, typer.Option("--fix", help="print overrides that resolve all fixable errors")] = False,
        with_mcore: Annotated[bool, typer.Option("--with-mcore", help="also build Megatron-Core's TransformerConfig "
                                                                      "(extra moetune[mcore])")] = False,
        as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    ) -> None:
        """Check a config against every Megatron-Core / Bridge rule (exit 1 on errors)."""
        config_file = None
        overrides: list[str] = []
        for a in args or []:
            if "=" in a.split("/")[0] and not Path(a).is_file():
                overrides.append(a)
            elif config_file is None:
                config_file = a
            else:
                raise InputError.bad_value("argument", a, "one CONFIG_FILE, then key.path=value overrides")
        out = run_check(config_file=config_file, recipe=recipe, megatron_args=megatron_args, overrides=overrides,
                        system=system, gpus=gpus, torch=torch, te=te, mcore=mcore, bridge=bridge,
                        env=_parse_env(env or []), fix=fix, with_mcore=with_mcore)
        res = out.pop("_result")
        if as_json:
            print_json(out)
        else:
            out["_result"] = res
            _render(out)
        raise typer.Exit(1 if res.errors else 0)
