// moetune serve: the page. Talks only to its own server: /api/<command> (the CLI's flags in, its --json out) and
// /ui/charts (the report's SVG charts for a result held here). No CDN, no network, no framework.
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);
const el = (tag, attrs = {}, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const k of kids) if (k !== null && k !== undefined) e.append(k);
  return e;
};
const fmt = (x, nd = 3) => {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  if (typeof x !== "number") return String(x);
  const a = Math.abs(x);
  if (a >= 1000) return x.toLocaleString("en-US", {maximumFractionDigits: 0});
  return Number(x.toPrecision(nd)).toString();
};
const pct = (x) => (x === null || x === undefined ? "–" : (100 * x).toFixed(1) + " %");

const state = {schema: null, plan: null, planArgs: null, sel: 0, base: null, baseArgs: null, whatif: null,
  modelFile: null, modelKind: null, seq: 0, wseq: 0};

// ------------------------------------------------------------------------------------------------ API
class ApiError extends Error {}

async function api(command, args, files) {
  let body, headers = {};
  if (files && Object.keys(files).length) {
    body = new FormData();
    for (const [k, v] of Object.entries(args)) {
      if (v === null || v === undefined) continue;
      for (const x of Array.isArray(v) ? v : [v]) body.append(k, String(x));
    }
    for (const [k, fl] of Object.entries(files)) for (const f of fl) body.append(k, f, f.name);
  } else {
    body = JSON.stringify(args);
    headers["Content-Type"] = "application/json";
  }
  const r = await fetch("/api/" + command, {method: "POST", body, headers});
  const data = await r.json().catch(() => ({error: `HTTP ${r.status}`}));
  if (!r.ok) throw new ApiError(data.error || `HTTP ${r.status}`);
  return data;
}

async function charts(body) {
  const r = await fetch("/ui/charts", {method: "POST", body: JSON.stringify(body),
    headers: {"Content-Type": "application/json"}});
  return r.ok ? r.json() : {};
}

function setStatus(text, kind = "") {
  const s = $("#status");
  s.textContent = text;
  s.className = "status " + kind;
}

// ------------------------------------------------------------------------------------------------ form
const FORM_FIELDS = ["model", "system", "gpus", "gbs", "seq", "precision", "fix", "top"];

async function loadCatalog() {
  const [models, systems] = await Promise.all([api("catalog/models", {}), api("catalog/systems", {})]);
  const ms = $("#f-model"), ss = $("#f-system");
  for (const m of models) {
    const b = m.total_params ? ` (${(m.total_params / 1e9).toFixed(0)}B` +
      (m.active_params && m.active_params !== m.total_params ? `, ${(m.active_params / 1e9).toFixed(1)}B active)` : ")") : "";
    ms.append(el("option", {value: m.name, text: m.name + b}));
  }
  for (const s of systems) ss.append(el("option", {value: s.name, text: `${s.name} (${s.gpu}, ${s.hbm_gib} GiB)`}));
  ms.value = "Qwen3-30B-A3B";
  ss.value = "DGX-H100";
  state.catalog = {models, systems};
}

function formArgs() {
  const a = {};
  for (const k of FORM_FIELDS) {
    const v = $("#f-" + k).value.trim();
    if (v !== "") a[k] = ["gpus", "gbs", "seq", "top"].includes(k) ? Number(v) : v;
  }
  return a;
}

function fillForm(params) {
  for (const k of FORM_FIELDS) {
    if (!params.has(k)) continue;
    const input = $("#f-" + k), v = params.get(k);
    if (input.tagName === "SELECT" && ![...input.options].some((o) => o.value === v)) {
      input.append(el("option", {value: v, text: v}));  // not in the catalog list: the server says what it is
    }
    input.value = v;
  }
}

function fileKind(file) {
  const k = $("#f-model-kind").value;
  if (k !== "auto") return k;
  const n = file.name.toLowerCase();
  if (n.endsWith(".json")) return "hf";
  if (n.endsWith(".yaml") || n.endsWith(".yml")) return n.includes("model_config") ? "megatron" : "bridge";
  return "megatron";
}

// ------------------------------------------------------------------------------------------------ plan
async function runPlan(ev) {
  if (ev) ev.preventDefault();
  const args = formArgs();
  const file = $("#f-model-file").files[0] || null;
  state.modelFile = file;
  state.modelKind = file ? fileKind(file) : null;
  const seq = ++state.seq;
  if (file && state.modelKind !== "hf") return runConfigFile(file, state.modelKind, args, seq);
  const files = file ? {model: [file]} : null;
  if (file) delete args.model;
  const q = new URLSearchParams(Object.entries(args).filter(([k]) => !file || k !== "model"));
  if (!file) history.replaceState(null, "", "/?" + q.toString());
  setStatus(`planning ${file ? file.name : args.model} on ${args.gpus} x ${args.system} ...`, "busy");
  $("#results").hidden = true;
  $("#detail").hidden = true;
  try {
    const plan = await api("plan", args, files);
    if (seq !== state.seq) return;
    state.plan = plan;
    state.planArgs = args;
    if (!plan.candidates || !plan.candidates.length) {
      const imp = plan.impossible || {};
      setStatus("No layout fits. " + (imp.summary || "") + " " + (imp.what_would_fit || []).join("; "), "error");
      return;
    }
    setStatus(`searched ${plan.searched} configs over ${plan.layouts} layouts in ${plan.seconds} s; ` +
      `${plan.feasible} feasible (${plan.headroom_policy})`);
    renderPlan(plan);
    await selectCandidate(0);
  } catch (e) {
    if (seq === state.seq) setStatus(e.message, "error");
  }
}

function layoutText(l) {
  let s = `TP${l.tp} PP${l.pp}` + (l.vpp > 1 ? ` VPP${l.vpp}` : "") + ` CP${l.cp} EP${l.ep} ETP${l.etp}`;
  if (l.dp !== undefined) s += ` DP${l.dp} EDP${l.edp}`;
  return s + ` MBS${l.mbs}`;
}

function featureText(f, l) {
  const parts = [];
  if (l.ep * l.etp > 1) parts.push(f.moe_token_dispatcher_type + (f.moe_flex_dispatcher_backend ? "/" + f.moe_flex_dispatcher_backend : ""));
  if (f.recompute_granularity === "full") parts.push("full recompute");
  else if (f.recompute_granularity === "selective") parts.push("recompute " + (f.recompute_modules || []).join("+"));
  if (f.use_megatron_fsdp) parts.push("Megatron-FSDP");
  if (f.tp_comm_overlap) parts.push("TP comm overlap");
  if (f.overlap_moe_expert_parallel_comm) parts.push("EP overlap" + (f.delay_wgrad_compute ? " + delayed wgrad" : ""));
  if (f.cuda_graph_scope && f.cuda_graph_scope.length && f.cuda_graph_impl !== "none") parts.push("graphs " + f.cuda_graph_scope.join(","));
  if (f.moe_expert_rank_capacity_factor != null)
    parts.push("rank capacity " + f.moe_expert_rank_capacity_factor + (f.moe_paged_stash ? " + paged stash" : ""));
  if (f.fine_grained_activation_offloading || f.optimizer_cpu_offload) parts.push("offload");
  return parts.join(", ") || "–";
}

// uncertainty, when the time model provides it: time.band {lo_s, hi_s, coverage} (perfmodel/uncertainty.py), or a
// [low, high] pair / {low, high} object under an interval-like key
function interval(t) {
  if (!t) return null;
  if (t.band && typeof t.band.lo_s === "number" && typeof t.band.hi_s === "number") return [t.band.lo_s, t.band.hi_s];
  for (const [k, v] of Object.entries(t)) {
    if (!/interval|uncertainty|_ci$|^ci$/.test(k)) continue;
    if (Array.isArray(v) && v.length === 2 && v.every((x) => typeof x === "number")) return v;
    if (v && typeof v === "object") {
      const lo = v.lo_s ?? v.low ?? v.lo ?? v.lower, hi = v.hi_s ?? v.high ?? v.hi ?? v.upper;
      if (typeof lo === "number" && typeof hi === "number") return [lo, hi];
    }
  }
  return null;
}

function stepText(t) {
  const iv = interval(t);
  return fmt(t.step_time_s, 4) + (iv ? ` [${fmt(iv[0], 3)}–${fmt(iv[1], 3)}]` : "");
}

// the three walls of docs/walls.md: memory, communication, compute efficiency (compute and host/launch)
const WALL_GROUPS = {
  communication: ["comm_tp", "comm_cp", "comm_ep", "comm_pp", "comm_dp"],
  "compute efficiency": ["compute", "recompute", "host", "optimizer"],
};

function wallSeconds(time) {
  const out = {};
  for (const [k, v] of Object.entries(time.walls || {})) out[k] = typeof v === "number" ? v : (v && v.seconds) || 0;
  return out;
}

// HBM left free on the most loaded rank (memory.headroom_gib is the policy's required margin, not this)
function freeGib(m) {
  const dev = (m.stages || []).map((s) => s.device_gib).filter((x) => typeof x === "number");
  return typeof m.capacity_gib === "number" && dev.length ? m.capacity_gib - Math.max(...dev) : null;
}

function renderVerdict(plan) {
  const c = plan.candidates[0], t = c.time, m = c.memory;
  const ws = wallSeconds(t), total = Object.values(ws).reduce((a, b) => a + b, 0) || 1;
  const box = $("#verdict");
  box.replaceChildren();
  box.append(el("div", {}, el("b", {text: "#1 "}), el("span", {id: "best-layout", text: layoutText(c.layout)}),
    ` — ${featureText(c.features, c.layout)} — `, el("b", {id: "best-step", text: stepText(t) + " s/step"}),
    `, ${fmt(t.tokens_per_s_per_gpu)} tokens/s/GPU, ${fmt(t.model_tflops_per_gpu)} TFLOP/s/GPU, MFU ` +
    pct((t.mfu || {}).vs_bf16_peak) + " of BF16 peak"));
  const binding = (m.stages || [])[m.binding_stage || 0] || {};
  const dom = t.dominant_wall;
  const group = Object.entries(WALL_GROUPS).find(([, ks]) => ks.includes(dom));
  const walls = el("div", {class: "walls3", id: "three-walls"});
  const free = freeGib(m);
  const memWall = el("div", {class: "wall" + (m.fits === false || (free !== null && free < 2 * (m.headroom_gib || 2)) ? " tight" : "")},
    el("b", {text: "memory wall"}), el("span", {class: "v", text: `${fmt(binding.device_gib)} / ${fmt(m.capacity_gib)} GiB`}),
    el("div", {text: `PP${binding.pp_rank ?? m.binding_stage} binds; ${fmt(free)} GiB free (policy keeps ${fmt(m.headroom_gib)})` +
      (m.fits === false ? " — does NOT fit" : "")}));
  walls.append(memWall);
  for (const [name, keys] of Object.entries(WALL_GROUPS)) {
    const s = keys.reduce((a, k) => a + (ws[k] || 0), 0);
    const parts = keys.filter((k) => ws[k] > 0).map((k) => `${k} ${fmt(ws[k])}`).join(", ");
    walls.append(el("div", {class: "wall" + (group && group[0] === name ? " dominant" : "")},
      el("b", {text: name + " wall"}), el("span", {class: "v", text: `${fmt(s)} s`}),
      el("div", {text: `${(100 * s / total).toFixed(1)} % of the step` + (group && group[0] === name ? ` (dominant: ${dom})` : "")}),
      el("div", {class: "hint", text: parts})));
  }
  const bubble = ws.pipeline_bubble || 0;
  box.append(el("div", {class: "hint", text: "The three walls (docs/walls.md): memory (device GiB of the most loaded rank vs HBM), " +
    "communication (exposed TP/CP/EP/PP/DP time), compute efficiency (compute, recompute, host/launch, optimizer)" +
    (bubble > 0 ? `; pipeline bubble ${fmt(bubble)} s (${(100 * bubble / total).toFixed(1)} %)` : "") + "."}), walls);
  const why = c.why;
  if (why) {
    const ld = Object.entries(why.layout_differences || {}).map(([k, [a, b]]) => `${k} ${a}→${b}`);
    const fd = Object.entries(why.feature_differences || {}).map(([k, v]) => `${k} ${Array.isArray(v) ? v.join("→") : v}`);
    const terms = (why.largest_terms || []).map((x) => `${x.term} ${x.delta_s >= 0 ? "+" : ""}${fmt(x.delta_s)} s`);
    const groups = planGroups(plan), tied = groups.slice(1).filter((g) => g.ties_with_first).map((g) => "#" + g.members[0]);
    const band = interval(t);
    box.append(el("div", {id: "why-1"}, el("b", {text: "Why #1: "}),
      `beats #2 by ${fmt(why.vs_next_step_time_s)} s/step (${fmt(why.vs_next_pct)} %)` +
      (band ? (tied.length ? ` — within noise: the prediction bands of ${tied.join(", ")} overlap #1's ` +
        `[${fmt(band[0], 4)}, ${fmt(band[1], 4)}] s` : ` — beyond the prediction band [${fmt(band[0], 4)}, ${fmt(band[1], 4)}] s` +
        (t.band && t.band.coverage ? ` (${Math.round(100 * t.band.coverage)} % band)` : "")) : "") +
      (ld.length || fd.length ? `; #2 differs in ${[...ld, ...fd].join(", ")}` : "") +
      (terms.length ? `; largest wall differences (#2 − #1, positive = #1 saves): ${terms.join(", ")}` : "")));
  } else if (plan.candidates.length === 1) {
    box.append(el("div", {id: "why-1", text: "Why #1: the only feasible candidate."}));
  }
}

// distinct layouts: the plan's groups (VPP/MBS near-duplicates folded, ties with #1) when it gives them, else
// one row per candidate
function planGroups(plan) {
  if (Array.isArray(plan.groups) && plan.groups.length) return plan.groups;
  return plan.candidates.map((c, i) => ({members: [i + 1], ties_with_first: i === 0}));
}

function renderPlan(plan) {
  renderVerdict(plan);
  const tb = $("#candidates");
  const anyBand = plan.candidates.some((c) => interval(c.time));
  tb.replaceChildren(el("tr", {}, ...["#", "layout", "features", anyBand ? "step s [band]" : "step s", "tokens/s/GPU",
    "TFLOP/s/GPU", "MFU", "device GiB / HBM", "free GiB", "dominant wall", "near-duplicates"].map((h) => el("th", {text: h}))));
  planGroups(plan).forEach((g, gi) => {
    const i = g.members[0] - 1, c = plan.candidates[i];
    const t = c.time, m = c.memory, st = (m.stages || [])[m.binding_stage || 0] || {};
    const others = g.members.slice(1);
    const dup = others.length ? `#${others.join(", #")} (VPP ${(g.vpp || []).join("/")}, MBS ${(g.mbs || []).join("/")}; ` +
      `${fmt((g.step_time_range_s || [])[0], 4)}–${fmt((g.step_time_range_s || [])[1], 4)} s)` : "–";
    const tie = gi > 0 && g.ties_with_first ? el("span", {class: "tie", text: " tie with #1 (within noise)"}) : null;
    tb.append(el("tr", {class: "cand", "data-index": String(i), onclick: () => selectCandidate(i)},
      el("td", {text: "#" + (i + 1)}), el("td", {class: "layout", text: layoutText(c.layout)}),
      el("td", {}, featureText(c.features, c.layout), tie), el("td", {class: "n step", text: stepText(t)}),
      el("td", {class: "n", text: fmt(t.tokens_per_s_per_gpu)}), el("td", {class: "n", text: fmt(t.model_tflops_per_gpu)}),
      el("td", {class: "n", text: pct((t.mfu || {}).vs_bf16_peak)}),
      el("td", {class: "n", text: `${fmt(st.device_gib)} / ${fmt(m.capacity_gib)}`}),
      el("td", {class: "n", text: fmt(freeGib(m))}), el("td", {text: t.dominant_wall || "–"}),
      el("td", {class: "hint", text: dup})));
  });
  $("#results").hidden = false;
}

function copyBlock(title, text, id) {
  const pre = el("pre", {id, text});
  const btn = el("button", {type: "button", class: "copy", text: "copy", onclick: async () => {
    try { await navigator.clipboard.writeText(text); btn.textContent = "copied"; } catch (e) {
      const r = document.createRange(); r.selectNodeContents(pre);
      const s = getSelection(); s.removeAllRanges(); s.addRange(r); document.execCommand("copy"); btn.textContent = "copied";
    }
    setTimeout(() => { btn.textContent = "copy"; }, 1500);
  }});
  return el("div", {class: "block"}, el("div", {class: "head"}, title, btn), pre);
}

function shellQuote(s) { return /^[A-Za-z0-9_./:=,+@%-]+$/.test(s) ? s : "'" + s.replace(/'/g, "'\\''") + "'"; }

function renderLaunch(c) {
  const L = c.launch || {}, box = $("#launch");
  box.replaceChildren();
  if (c.reproduce) box.append(copyBlock("reproduce (moetune estimate)", c.reproduce, "launch-reproduce"));
  box.append(el("div", {class: "hint", text: `${L.nodes} nodes x ${L.gpus_per_node} GPUs` + (L.recipe ? `, Bridge recipe ${L.recipe}` : "")}));
  if (L.bridge_overrides_tuning) box.append(copyBlock("Bridge overrides (layout and features)", L.bridge_overrides_tuning.join(" "), "launch-bridge"));
  if (L.bridge_overrides) box.append(copyBlock("Bridge overrides (everything)", L.bridge_overrides.join(" "), "launch-bridge-all"));
  if (L.megatron_args) box.append(copyBlock("Megatron-LM flags", (Array.isArray(L.megatron_args) ? L.megatron_args.map(shellQuote).join(" ") : L.megatron_args), "launch-megatron"));
  if (L.env) box.append(copyBlock("env", Object.entries(L.env).map(([k, v]) => `export ${k}=${shellQuote(String(v))}`).join("\n"), "launch-env"));
  if (L.slurm_script) box.append(copyBlock("Slurm script", L.slurm_script, "launch-slurm"));
}

function putSvg(id, svg) {
  const d = document.getElementById(id);
  d.innerHTML = svg || "";
}

async function selectCandidate(i) {
  const plan = state.plan, c = plan.candidates[i];
  state.sel = i;
  for (const tr of document.querySelectorAll("#candidates tr.cand")) tr.classList.toggle("selected", Number(tr.dataset.index) === i);
  $("#sel-title").textContent = `Candidate #${i + 1}: ${layoutText(c.layout)}`;
  renderLaunch(c);
  const ch = await charts({result: c, candidates: plan.candidates});
  putSvg("chart-memory", ch.memory);
  putSvg("chart-walls", ch.walls);
  putSvg("chart-throughput", ch.throughput);
  await openEstimate(await estimateArgsFor(c, state.planArgs));
}

// ------------------------------------------------------------------------------------------------ estimate
async function estimateArgsFor(c, planArgs) {
  if (c.reproduce) {  // the candidate's own `moetune estimate ...` line, parsed by the server with the CLI's options
    const r = await fetch("/ui/reproduce", {method: "POST", body: JSON.stringify({line: c.reproduce}),
      headers: {"Content-Type": "application/json"}});
    const d = await r.json();
    if (r.ok && d.command === "estimate") return d.args;
  }
  // no reproduce line in this plan JSON: the candidate's layout and features as estimate flags
  const l = c.layout, f = c.features, req = state.plan.request || {};
  const a = {model: req.model || planArgs.model, system: req.system || planArgs.system, gpus: req.gpus || planArgs.gpus,
    gbs: req.gbs || planArgs.gbs, seq: req.seq || planArgs.seq, mbs: l.mbs, precision: f.precision,
    tp: l.tp, pp: l.pp, cp: l.cp, ep: l.ep, etp: l.etp,
    dispatcher: f.moe_token_dispatcher_type === "flex" ? (f.moe_flex_dispatcher_backend || "deepep") : f.moe_token_dispatcher_type,
    recompute: f.recompute_granularity === "full" ? `full:${f.recompute_method || "uniform"}:${f.recompute_num_layers || 1}` :
      f.recompute_granularity === "selective" ? (f.recompute_modules || []).join(",") : "none",
    expandable_segments: !!f.expandable_segments};
  if (l.vpp > 1) a.vpp = l.vpp;
  if (l.pipeline_layout) a.pipeline_layout = l.pipeline_layout;
  if (f.cuda_graph_scope && f.cuda_graph_scope.length && f.cuda_graph_impl !== "none") a.cuda_graph_scope = f.cuda_graph_scope.join(",");
  if (f.fine_grained_activation_offloading && f.offload_modules && f.offload_modules.length) a.offload_modules = f.offload_modules.join(",");
  if (f.optimizer_cpu_offload) a.optimizer_offload = f.optimizer_offload_fraction;
  if (f.moe_expert_rank_capacity_factor != null && estimateHas("rank_capacity_factor"))
    a.rank_capacity_factor = String(f.moe_expert_rank_capacity_factor);
  if (f.moe_paged_stash && estimateHas("paged_stash")) a.paged_stash = true;
  for (const [flag, field] of [["ep_overlap", "overlap_moe_expert_parallel_comm"], ["delay_wgrad", "delay_wgrad_compute"],
    ["fsdp", "use_megatron_fsdp"], ["tp_comm_overlap", "tp_comm_overlap"]]) if (estimateHas(flag)) a[flag] = !!f[field];
  return a;
}

function estimateHas(flag) {
  const sch = state.schema && state.schema.estimate;
  if (!sch) return false;
  const props = sch.properties || sch.args || sch;
  return Array.isArray(props) ? props.some((p) => (p.name || p) === flag) : Object.prototype.hasOwnProperty.call(props, flag);
}

function estimateFiles(args) {
  // an uploaded model file travels with every estimate request (the server keeps nothing between requests)
  if (!state.modelFile) return null;
  const key = state.modelKind === "hf" ? "model" : state.modelKind === "bridge" ? "bridge_config" : "megatron_args";
  delete args[key];
  return {[key]: [state.modelFile]};
}

async function estimate(args) {
  const a = {...args};
  const files = estimateFiles(a);
  return api("estimate", a, files);
}

function summary(est) {
  const m = est.memory, t = est.time || {};
  const binding = (m.stages || [])[m.binding_stage || 0] || {};
  return {"step time (s)": t.step_time_s, "tokens/s/GPU": t.tokens_per_s_per_gpu, "TFLOP/s/GPU": t.model_tflops_per_gpu,
    "peak allocated (GiB)": m.peak_allocated_gib, "device GiB, binding rank": binding.device_gib,
    "free HBM, binding rank (GiB)": freeGib(m), fits: m.fits, "dominant wall": t.dominant_wall};
}

async function openEstimate(args) {
  state.baseArgs = args;
  $("#detail").hidden = false;
  $("#whatif-delta").replaceChildren();
  putSvg("chart-whatif-memory", "");
  putSvg("chart-whatif-walls", "");
  $("#itemised").replaceChildren(el("div", {class: "hint", text: "estimating ..."}));
  setToggles(args);
  try {
    state.base = await estimate(args);
  } catch (e) {
    state.base = null;
    $("#itemised").replaceChildren(el("div", {class: "error", text: e.message}));
    return;
  }
  $("#detail-title").textContent = "moetune estimate " + Object.entries(args).map(([k, v]) =>
    typeof v === "boolean" ? (v ? `--${k.replace(/_/g, "-")}` : `--no-${k.replace(/_/g, "-")}`) : `--${k.replace(/_/g, "-")} ${shellQuote(String(v))}`).join(" ");
  renderItemised(state.base);
  renderDelta(state.base, null);
  if (state.modelKind === "bridge" || state.modelKind === "megatron") {
    setToggles(togglesFromJob(state.base.job || {}), state.modelKind);
    $("#detail-title").textContent = `moetune estimate --${state.modelKind === "bridge" ? "bridge-config" : "megatron-args"} ` +
      `${shellQuote(state.modelFile.name)} ` + $("#detail-title").textContent.replace(/^moetune estimate /, "");
  }
  const c = state.plan && state.plan.candidates[state.sel];
  if (c && (!state.modelKind || state.modelKind === "hf")) {
    const ps = c.time.step_time_s, es = (state.base.time || {}).step_time_s;
    const same = typeof es === "number" && Math.abs(es - ps) <= 1e-3 * ps;
    $("#itemised").prepend(el("div", {id: "reproduces", class: same ? "hint" : "warn",
      text: same ? `estimate reproduces the plan's ${fmt(ps, 4)} s/step` :
        `estimate of these flags gives ${fmt(es, 4)} s/step where the plan says ${fmt(ps, 4)} s/step` +
        (c.reproduce ? "" : " (this plan JSON has no reproduce line; estimate lacks some of the plan's feature flags)")}));
  }
}

function renderItemised(est) {
  const box = $("#itemised");
  box.replaceChildren();
  const m = est.memory, stages = m.stages || [];
  const names = [];
  for (const s of stages) for (const k of Object.keys(s.components || {})) if (!names.includes(k)) names.push(k);
  const t = el("table", {class: "grid", id: "memory-table"},
    el("tr", {}, el("th", {text: "memory (GiB per GPU)"}), ...stages.map((s) => el("th", {text: `PP${s.pp_rank}` + (s.binding ? " ◀ binding" : "")}))));
  for (const n of names) t.append(el("tr", {}, el("td", {text: n}), ...stages.map((s) => el("td", {class: "n", text: fmt((s.components || {})[n] || 0)}))));
  for (const [label, key] of [["peak allocated", "peak_allocated_gib"], ["reserved", "reserved_gib"], ["device total", "device_gib"]]) {
    t.append(el("tr", {}, el("th", {text: label}), ...stages.map((s) => el("td", {class: "n", text: fmt(s[key])}))));
  }
  box.append(el("h3", {text: `Memory per pipeline rank (HBM ${fmt(m.capacity_gib)} GiB; ${m.headroom_policy || ""})`}), el("div", {class: "scroll"}, t));
  const tm = est.time;
  if (tm) {
    const wt = el("table", {class: "grid", id: "walls-table"}, el("tr", {}, ...["wall", "seconds per step", "share"].map((h) => el("th", {text: h}))));
    for (const [k, v] of Object.entries(tm.walls || {})) {
      const s = typeof v === "number" ? v : v.seconds, sh = typeof v === "number" ? null : v.share;
      wt.append(el("tr", {}, el("td", {text: k}), el("td", {class: "n", text: fmt(s, 4)}), el("td", {class: "n", text: sh === null ? "–" : pct(sh)})));
    }
    box.append(el("h3", {text: `Time per wall: ${fmt(tm.step_time_s, 4)} s/step, ${fmt(tm.tokens_per_s_per_gpu)} tokens/s/GPU, dominant ${tm.dominant_wall}`}), wt);
  }
  const as = est.assumptions || [];
  if (as.length) box.append(el("h3", {text: "Assumptions"}), el("ul", {class: "tight"}, ...as.map((a) => el("li", {text: a}))));
}

function renderDelta(base, what) {
  const box = $("#whatif-delta");
  const b = summary(base), w = what ? summary(what) : null;
  const t = el("table", {class: "grid", id: "delta-table"}, el("tr", {}, ...["", "this candidate", "what-if", "delta"].map((h) => el("th", {text: h}))));
  const lowerBetter = {"step time (s)": 1, "peak allocated (GiB)": 1, "device GiB, binding rank": 1};  // free HBM: higher
  for (const [k, v] of Object.entries(b)) {
    const x = w ? w[k] : null;
    let d = "", cls = "";
    if (w && typeof v === "number" && typeof x === "number") {
      const dv = x - v;
      d = (dv >= 0 ? "+" : "") + fmt(dv, 3) + (v ? ` (${(dv >= 0 ? "+" : "") + (100 * dv / v).toFixed(1)} %)` : "");
      if (Math.abs(dv) > 1e-12) cls = (dv < 0) === !!lowerBetter[k] ? "delta-better" : "delta-worse";
    } else if (w && x !== v) d = `${v} → ${x}`;
    t.append(el("tr", {"data-metric": k}, el("td", {text: k}), el("td", {class: "n base", text: fmt(v, 4)}),
      el("td", {class: "n whatif", text: w ? fmt(x, 4) : "–"}), el("td", {class: "n delta " + cls, text: d})));
  }
  box.replaceChildren(t);
}

const TOGGLES = ["recompute", "dispatcher", "ep_overlap", "delay_wgrad", "cuda_graph_scope", "mbs"];

function normRecompute(v) {
  if (!v || v === "none") return "none";
  if (String(v).startsWith("full")) return "full";
  return v === "core_attn" ? "selective" : v;
}

// the toggles' values of an estimated job (config-file modes: the file's own features)
function togglesFromJob(job) {
  const f = job.features || {};
  return {recompute: f.recompute_granularity === "full" ? "full" : f.recompute_granularity === "selective" ?
    (f.recompute_modules || []).join(",") : "none",
  dispatcher: f.moe_token_dispatcher_type === "flex" ? (f.moe_flex_dispatcher_backend || "deepep") : f.moe_token_dispatcher_type,
  ep_overlap: !!f.overlap_moe_expert_parallel_comm, delay_wgrad: !!f.delay_wgrad_compute,
  cuda_graph_scope: f.cuda_graph_impl !== "none" && (f.cuda_graph_scope || []).length ? f.cuda_graph_scope.join(",") : "none",
  mbs: job.micro_batch_size};
}

// a Bridge YAML job's what-ifs are Hydra-style overrides of the Bridge fields (estimate takes no flags with a file)
function bridgeOverrides(k, v) {
  const list = (x) => "[" + String(x).split(",").join(",") + "]";
  switch (k) {
    case "recompute":
      if (v === "none") return ["model.recompute_granularity=null"];
      if (v === "full") return ["model.recompute_granularity=full", "model.recompute_method=uniform", "model.recompute_num_layers=1"];
      return ["model.recompute_granularity=selective", "model.recompute_modules=" + list(v === "selective" ? "core_attn" : v)];
    case "dispatcher":
      return ["alltoall", "allgather"].includes(v) ? ["model.moe_token_dispatcher_type=" + v] :
        ["model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_backend=" + v];
    case "ep_overlap": return ["comm_overlap.overlap_moe_expert_parallel_comm=" + v];
    case "delay_wgrad": return ["comm_overlap.delay_wgrad_compute=" + v];
    case "cuda_graph_scope":
      return v === "none" ? ["model.cuda_graph_impl=none"] : ["model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=" + list(v)];
    case "mbs": return ["train.micro_batch_size=" + v];
  }
  return [];
}

function setToggles(args, mode = "flags") {
  const note = [];
  state.toggleInit = {};
  for (const k of TOGGLES) $("#w-" + k).disabled = mode === "megatron";
  if (mode === "megatron") note.push("what-ifs need flags or a Bridge YAML: a Megatron-LM args file takes no overrides");
  for (const k of TOGGLES) {
    const input = $("#w-" + k);
    const v = args[k];
    if (input.type === "checkbox") {
      const ok = mode === "bridge" || (mode === "flags" && estimateHas(k));
      input.disabled = !ok;
      input.checked = ok && !!v;
      state.toggleInit[k] = input.checked;
      if (!ok && mode === "flags") note.push(`${k.replace("_", " ")} needs estimate --${k.replace("_", "-")}`);
      continue;
    }
    let val = k === "recompute" ? normRecompute(v) : v === undefined || v === null ? (k === "mbs" ? "1" : k === "dispatcher" ? "alltoall" : "none") : String(v);
    if (![...input.options].some((o) => o.value === val)) input.append(el("option", {value: val, text: val}));
    input.value = val;
    state.toggleInit[k] = val;
  }
  $("#whatif-note").textContent = note.length ? "(" + note.join("; ") + ")" : "";
}

async function runWhatIf() {
  if (!state.baseArgs || !state.base) return;
  const a = {...state.baseArgs};
  for (const k of TOGGLES) {
    const input = $("#w-" + k);
    if (input.disabled) continue;
    const v = input.type === "checkbox" ? input.checked : input.value;
    if (v === state.toggleInit[k]) continue;  // unchanged: the candidate's own value stays
    if (state.modelKind === "bridge") a.overrides = [...(a.overrides || []), ...bridgeOverrides(k, v)];
    else if (k === "mbs") a.mbs = Number(v);
    else if (k === "cuda_graph_scope" && v === "none" && a.cuda_graph_scope !== "none") delete a.cuda_graph_scope;
    else a[k] = v;
  }
  const seq = ++state.wseq;
  $("#whatif-delta").prepend(el("div", {class: "hint busy", text: "re-estimating ..."}));
  try {
    const w = await estimate(a);
    if (seq !== state.wseq) return;
    state.whatif = w;
    renderDelta(state.base, w);
    const ch = await charts({result: w, label: "What-if: "});
    putSvg("chart-whatif-memory", ch.memory);
    putSvg("chart-whatif-walls", ch.walls);
  } catch (e) {
    if (seq !== state.wseq) return;
    renderDelta(state.base, null);
    $("#whatif-delta").prepend(el("div", {class: "error", id: "whatif-error", text: e.message}));
  }
}

// an uploaded Bridge YAML / Megatron-LM args file: estimate and check it as given (plan takes catalog / HF models)
async function runConfigFile(file, kind, args, seq) {
  $("#results").hidden = true;
  setStatus(`estimating and checking ${file.name} (${kind === "bridge" ? "Bridge YAML" : "Megatron-LM args"}) ...`, "busy");
  const a = {system: args.system};
  if (args.gpus) a.gpus = args.gpus;
  await openEstimate(a);
  if (seq !== state.seq) return;
  setStatus(state.base ? `${file.name}: itemised estimate below; check findings in the Evidence pane` : "", state.base ? "" : "error");
  const files = kind === "bridge" ? {args: [file]} : {megatron_args: [file]};
  runCheck(null, files);
}

// ------------------------------------------------------------------------------------------------ evidence
async function runCheck(ev, filesOverride) {
  if (ev) ev.preventDefault();
  const out = $("#check-out");
  const f = $("#c-file").files[0];
  const files = filesOverride || (f ? {args: [f]} : null);
  if (!files) { out.replaceChildren(el("div", {class: "error", text: "choose a config file"})); return; }
  const ov = $("#c-overrides").value.trim();
  const args = {system: $("#f-system").value};
  if ($("#f-gpus").value) args.gpus = Number($("#f-gpus").value);
  if (ov) args.args = ov.split(/\s+/);
  out.replaceChildren(el("div", {class: "hint", text: "checking ..."}));
  try {
    const r = await api("check", args, files);
    renderCheck(r);
  } catch (e) { out.replaceChildren(el("div", {class: "error", text: e.message})); }
}

function renderCheck(r) {
  const out = $("#check-out"), fs = r.findings || [];
  const counts = {};
  for (const f of fs) counts[f.severity] = (counts[f.severity] || 0) + 1;
  out.replaceChildren(el("div", {id: "check-summary", text: `${fs.length} findings: ` + (Object.entries(counts).map(([k, v]) => `${v} ${k}`).join(", ") || "none")}));
  if (!fs.length) return;
  const t = el("table", {class: "grid", id: "check-table"}, el("tr", {}, ...["severity", "rule", "message", "fix", "source"].map((h) => el("th", {text: h}))));
  for (const f of fs) {
    const fix = f.fix ? Object.entries(f.fix).map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(" ") : "";
    t.append(el("tr", {}, el("td", {class: "sev-" + f.severity, text: f.severity}), el("td", {text: f.id}), el("td", {text: f.message}),
      el("td", {}, fix ? el("code", {text: fix}) : ""), el("td", {class: "hint", text: f.source || ""})));
  }
  out.append(el("div", {class: "scroll"}, t));
  const fixes = r.fix_overrides || r.fixes || r.overrides;
  if (Array.isArray(fixes) && fixes.length) out.append(copyBlock("overrides that resolve the fixable errors", fixes.join(" "), "check-fixes"));
}

async function runLogs(ev) {
  ev.preventDefault();
  const out = $("#logs-out"), fl = [...$("#l-file").files];
  if (!fl.length) { out.replaceChildren(el("div", {class: "error", text: "choose a log file"})); return; }
  const args = {};
  const w = $("#l-window").value.trim();
  if (w) args.window = w;
  out.replaceChildren(el("div", {class: "hint", text: "reading ..."}));
  const [steady, diag] = await Promise.allSettled([api("logs", args, {files: fl}), api("diagnose", {}, {files: fl})]);
  out.replaceChildren();
  if (steady.status === "fulfilled") renderSteady(out, steady.value);
  else out.append(el("div", {class: diag.status === "fulfilled" && (diag.value.findings || []).length ? "warn" : "error",
    text: steady.reason.message}));
  if (diag.status === "fulfilled") renderDiagnosis(out, diag.value);
  else out.append(el("div", {class: "error", text: diag.reason.message}));
}

function renderSteady(out, r) {
  for (const s of r.runs || []) {
    const st = s.step_time_s || {}, lo = s.loss || {}, mem = s.memory || {};
    const rows = [["file", `${s.file} (${s.source})`], ["steady window", `${JSON.stringify(s.steady_window)} (${s.window_source}, ${s.samples} samples)`],
      ["step time", `median ${fmt(st.median, 4)} s, mean ${fmt(st.mean, 4)} s` + (st.ci ? `, 95 % CI of median [${fmt(st.ci[0], 4)}, ${fmt(st.ci[1], 4)}]` : "")],
      ["tokens/s/GPU", fmt(s.tokens_per_s_per_gpu)], ["TFLOP/s/GPU", fmt((s.tflops_per_gpu || {}).median)],
      ["loss", `finite ${lo.finite}, NaN iterations ${lo.nan_iteration_count ?? (lo.nan_iterations || []).length}, skipped ${lo.skipped_iterations}, first ${fmt(lo.first)}, last ${fmt(lo.last)}`]];
    if (mem.peak_max_allocated_gib !== undefined && mem.peak_max_allocated_gib !== null) rows.push(["memory", `peak max-allocated ${fmt(mem.peak_max_allocated_gib)} GiB, max-reserved ${fmt(mem.peak_max_reserved_gib)} GiB`]);
    for (const n of s.notes || []) rows.push(["note", n]);
    out.append(el("h3", {text: "Steady state"}), el("table", {class: "grid steady"}, ...rows.map(([k, v]) => el("tr", {}, el("th", {text: k}), el("td", {text: v})))));
  }
}

function renderDiagnosis(out, r) {
  const fs = r.findings || [];
  out.append(el("h3", {text: "Diagnosis"}));
  if (!fs.length) { out.append(el("div", {id: "diagnosis-none", text: "no failure or anomaly recognised"})); return; }
  for (const f of fs) {
    out.append(el("div", {class: "finding"}, el("div", {}, el("span", {class: "sev-" + f.severity, text: `[${f.severity}] ${f.kind}`}), ": " + f.summary),
      el("div", {text: "cause: " + (f.cause || "")}), el("div", {class: "hint", text: "confirm: " + (f.confirm || "")}),
      el("ol", {class: "tight"}, ...(f.fixes || []).map((x) => el("li", {text: x}))),
      (f.evidence || []).length ? el("pre", {text: f.evidence.slice(0, 6).map((e) => `${e.file || ""}:${e.line}: ${e.text}`).join("\n")}) : null));
  }
}

async function runTrace(ev) {
  ev.preventDefault();
  const out = $("#trace-out"), fl = [...$("#t-file").files];
  if (!fl.length) { out.replaceChildren(el("div", {class: "error", text: "choose a trace file"})); return; }
  out.replaceChildren(el("div", {class: "hint", text: "analysing ..."}));
  try {
    const r = await api("trace", {}, {paths: fl});
    out.replaceChildren();
    const t = el("table", {class: "grid", id: "trace-table"}, el("tr", {}, ...["rank", "window s", "compute s", "hidden comm s", "exposed comm s", "overlap", "host-bound idle s", "dependency idle s", "dominant wall"].map((h) => el("th", {text: h}))));
    for (const k of r.ranks || []) {
      const idle = k.idle || {};
      t.append(el("tr", {}, el("td", {text: String(k.rank)}), el("td", {class: "n", text: fmt(k.window_s, 4)}), el("td", {class: "n", text: fmt(k.compute_s, 4)}),
        el("td", {class: "n", text: fmt(k.hidden_comm_s, 4)}), el("td", {class: "n", text: fmt(k.exposed_comm_s, 4)}),
        el("td", {class: "n", text: k.comm_compute_overlap_pct === undefined ? "–" : fmt(k.comm_compute_overlap_pct) + " %"}),
        el("td", {class: "n", text: fmt(idle.host_bound_s, 4)}), el("td", {class: "n", text: fmt(idle.dependency_s, 4)}), el("td", {text: k.dominant_wall || "–"})));
    }
    out.append(el("div", {class: "scroll"}, t));
    for (const k of (r.ranks || []).slice(0, 4)) {
      const ex = Object.entries(k.exposed_comm_by_kind || {}).sort((a, b) => b[1] - a[1]);
      if (ex.length) out.append(el("div", {class: "hint", text: `rank ${k.rank} exposed communication by kind: ` + ex.map(([n, v]) => `${n} ${fmt(v * 1000)} ms`).join(", ")}));
    }
    const ch = await charts({trace: r});
    const cd = el("div", {class: "charts"});
    for (const svg of ch.comm || []) { const d = el("div", {class: "chart"}); d.innerHTML = svg; cd.append(d); }
    out.append(cd);
    for (const n of r.notes || []) out.append(el("div", {class: "hint", text: n}));
  } catch (e) { out.replaceChildren(el("div", {class: "error", text: e.message})); }
}

// ------------------------------------------------------------------------------------------------ start
async function main() {
  $("#plan-form").addEventListener("submit", runPlan);
  $("#check-form").addEventListener("submit", runCheck);
  $("#logs-form").addEventListener("submit", runLogs);
  $("#trace-form").addEventListener("submit", runTrace);
  for (const k of TOGGLES) $("#w-" + k).addEventListener("change", runWhatIf);
  $("#w-reset").addEventListener("click", () => {
    const cfg = state.modelKind === "bridge" || state.modelKind === "megatron";
    setToggles(cfg && state.base ? togglesFromJob(state.base.job || {}) : state.baseArgs || {}, cfg ? state.modelKind : "flags");
    renderDelta(state.base, null);
    putSvg("chart-whatif-memory", ""); putSvg("chart-whatif-walls", ""); });
  try {
    const [, schema] = await Promise.all([loadCatalog(), fetch("/api/schema").then((r) => (r.ok ? r.json() : null)).catch(() => null)]);
    state.schema = schema;
  } catch (e) {
    setStatus("catalog: " + e.message, "error");
  }
  const params = new URLSearchParams(location.search);
  fillForm(params);
  if (params.has("model")) runPlan(null);
  document.body.dataset.ready = "1";
}

main();
