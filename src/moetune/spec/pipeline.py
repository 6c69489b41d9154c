"""Which layers each pipeline rank holds: uniform / uneven splits, VPP, and Megatron pipeline-layout strings.

Sources (Megatron-Core):

* ``megatron/core/transformer/pipeline_parallel_layer_layout.py`` — ``PipelineParallelLayerLayout``:
  ``parse_str_to_list`` (``E`` embedding, ``t`` decoder, ``m`` MTP, ``L`` loss, ``|`` stage boundary, ``x*n`` and
  ``(…)*n`` repeats, commas are cosmetic), ``__init__`` (stage *i* → PP rank ``i % PP``, virtual chunk ``i // PP``;
  ``#stages % PP == 0``; VPP = ``#stages / PP``), ``validate_layer_layout`` (one ``E`` first, one ``L`` last, ``t``
  count = ``num_layers``, ``m`` count = ``mtp_num_layers``, no decoder after the first MTP, MTP only in the last
  virtual stage of a rank and all of it in one stage) and ``get_layer_offset`` (decoder ids are assigned in
  virtual-chunk-major order).
* ``megatron/core/transformer/transformer_block.py::get_num_layers_to_build`` and
  ``transformer_layer.py::get_transformer_layer_offset`` — uniform split of ``num_layers`` (+1 for
  ``account_for_embedding_in_pipeline_split``, +1 for ``account_for_loss_in_pipeline_split``) over PP then VPP; the
  first (last) virtual stage of the first (last) PP rank builds one layer fewer; ``num_layers_in_first/last_pipeline_
  stage`` are split evenly over that rank's VPP chunks and the remaining layers over the middle ranks.
* ``TransformerConfig.__post_init__`` — the constraints raised here (docs/rules.md PAR-006, PAR-026..PAR-033).
* Without a layout the MTP block is built on the last virtual stage of the last PP rank
  (``megatron/core/models/gpt/gpt_model.py``: ``mtp_on_this_rank``), as are the output layer and the loss.

The Bridge recipes also pass the layout as a list of lists of layer-type names
(``[["embedding", "decoder"], ["decoder", "mtp", "loss"]]``); :func:`parse_pipeline_layout` takes both forms.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from moetune.errors import LayoutError
from moetune.memo import memo

if TYPE_CHECKING:
    from moetune.spec.layout import Layout
    from moetune.spec.model import ModelArch

#: layer-type names of MCore ``LayerType`` (as used in list-form layouts) -> layout characters
_NAME_TO_CHAR = {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L", "e": "E", "t": "t", "m": "m", "l": "L"}
_CHARS = frozenset("EtmL")

#: a parsed layout: one string per (PP x VPP) stage in stage order, each a string over "EtmL"
Stages = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Chunk:
    """One virtual pipeline chunk (model chunk) of one PP rank."""

    vchunk: int
    layers: tuple[int, ...]  #: decoder layer indices (into ModelArch.mixer_pattern / mlp_pattern)
    embedding: bool = False  #: holds the input embedding
    loss: bool = False  #: holds the final norm + output layer + loss
    mtp_layers: int = 0  #: multi-token-prediction layers built in this chunk

    @property
    def num_layers(self) -> int:
        return len(self.layers)


@dataclass(frozen=True, slots=True)
class PipelineRank:
    """The chunks one PP rank holds (``len(chunks)`` = VPP)."""

    pp_rank: int
    chunks: list[Chunk] = field(default_factory=list)

    @property
    def layers(self) -> tuple[int, ...]:
        """All decoder layer indices on this rank, in chunk order."""
        return tuple(i for c in self.chunks for i in c.layers)

    @property
    def num_layers(self) -> int:
        return sum(len(c.layers) for c in self.chunks)

    @property
    def embedding(self) -> bool:
        return any(c.embedding for c in self.chunks)

    @property
    def loss(self) -> bool:
        return any(c.loss for c in self.chunks)

    @property
    def mtp_layers(self) -> int:
        return sum(c.mtp_layers for c in self.chunks)


# ------------------------------------------------------------------------------------------------------------
# layout strings
# ------------------------------------------------------------------------------------------------------------


def _expand(text: str, pos: int, depth: int) -> tuple[str, int]:
    """Expand repeats in ``text`` from ``pos`` until a closing parenthesis (depth > 0) or the end.

    ``x*n`` repeats the single preceding character (which may be ``|``), ``(…)*n`` repeats a group — the two
    substitutions of ``PipelineParallelLayerLayout.parse_str_to_list`` (groups may nest here).
    """
    out: list[str] = []
    n = len(text)
    while pos < n:
        ch = text[pos]
        if ch == ")":
            if depth == 0:
                raise LayoutError(f"pipeline_model_parallel_layout={text!r}: unbalanced ')' at position {pos}")
            return "".join(out), pos + 1
        if ch == "(":
            inner, pos = _expand(text, pos + 1, depth + 1)
            unit = inner
        elif ch == "*":
            raise LayoutError(f"pipeline_model_parallel_layout={text!r}: '*' at position {pos} repeats nothing")
        else:
            unit = ch
            pos += 1
        if pos < n and text[pos] == "*":
            j = pos + 1
            while j < n and text[j].isdigit():
                j += 1
            if j == pos + 1:
                raise LayoutError(f"pipeline_model_parallel_layout={text!r}: '*' at position {pos} needs a count")
            unit = unit * int(text[pos + 1 : j])
            pos = j
        out.append(unit)
    if depth > 0:
        raise LayoutError(f"pipeline_model_parallel_layout={text!r}: unbalanced '('")
    return "".join(out), pos


@memo(maxsize=4096)
def _parse_str(text: str) -> Stages:
    raw = "".join(text.split()).replace(",", "")  # whitespace and commas are cosmetic
    if not raw:
        raise LayoutError("pipeline_model_parallel_layout='': expected stages such as 'Et*3|(tt|)*29m|L'")
    flat, _ = _expand(raw, 0, 0)
    stages = tuple(flat.split("|"))
    for s in stages:
        bad = set(s) - _CHARS
        if bad:
            raise LayoutError(
                f"pipeline_model_parallel_layout={text!r}: unknown layer character(s) {sorted(bad)};"
                " expected E (embedding), t (decoder), m (MTP), L (loss), '|', 'x*n', '(...)*n'"
            )
    return stages


def _parse_list(rows: Sequence) -> Stages:
    stages: list[str] = []
    for i, row in enumerate(rows):
        if isinstance(row, str) or not isinstance(row, Sequence):
            raise LayoutError(f"pipeline_model_parallel_layout[{i}]={row!r}: expected a list of layer-type names")
        chars = []
        for item in row:
            key = str(item).strip()
            key = key.split(".")[-1]  # 'LayerType.decoder'
            c = _NAME_TO_CHAR.get(key) or _NAME_TO_CHAR.get(key.lower())
            if c is None:
                raise LayoutError(
                    f"pipeline_model_parallel_layout[{i}] has {item!r}: expected embedding, decoder, mtp or loss"
                )
            chars.append(c)
        stages.append("".join(chars))
    if not stages:
        raise LayoutError("pipeline_model_parallel_layout=[]: expected at least one stage")
    return tuple(stages)


def parse_pipeline_layout(spec: str | Sequence[Sequence[str]]) -> Stages:
    """Stages of a pipeline layout, one string over ``E t m L`` per stage, in stage order.

    Accepts the MCore string form (``'Et*3|(tt|)*29m|L'``), the Bridge list-of-lists form
    (``[["embedding", "decoder"], ["decoder", "loss"]]``) or that list written as a string.
    """
    if isinstance(spec, str):
        s = spec.strip()
        if s.startswith("["):
            try:
                rows = ast.literal_eval(s)
            except (ValueError, SyntaxError):
                raise LayoutError(
                    f"pipeline_model_parallel_layout={spec!r}: not a valid list of lists of layer names"
                ) from None
            return _parse_list(rows)
        return _parse_str(s)
    return _parse_list(spec)


def layout_to_str(spec: str | Sequence[Sequence[str]]) -> str:
    """Canonical string form (``'Ettt|tt|…|L'``, repeats expanded) of either layout form."""
    return "|".join(parse_pipeline_layout(spec))


def layout_vpp(spec: str | Sequence[Sequence[str]], pp: int) -> int:
    """VPP implied by a layout: #stages / PP (PAR-031)."""
    stages = parse_pipeline_layout(spec)
    if len(stages) % pp:
        raise LayoutError(
            f"pipeline_model_parallel_layout has {len(stages)} stages, not a multiple of"
            f" pipeline_model_parallel_size={pp} (PAR-031)"
        )
    return len(stages) // pp


# ------------------------------------------------------------------------------------------------------------
# stage contents
# ------------------------------------------------------------------------------------------------------------


def layout_contents_error(stages: Stages, num_layers: int | None, mtp: int | None) -> str | None:
    """What is wrong with the layer items of a parsed layout, or None (PAR-032; MCore
    ``PipelineParallelLayerLayout.validate_layer_layout``): one embedding first, one loss last, ``num_layers`` decoder
    layers, ``mtp`` MTP layers after every decoder layer. ``num_layers``/``mtp`` None skip their count check."""
    flat = "".join(stages)
    if not flat or flat[0] != "E" or flat.count("E") != 1:
        return "pipeline_model_parallel_layout: embedding 'E' must appear exactly once, first (PAR-032)"
    if flat[-1] != "L" or flat.count("L") != 1:
        return "pipeline_model_parallel_layout: loss 'L' must appear exactly once, last (PAR-032)"
    nt = flat.count("t")
    if num_layers is not None and nt != num_layers:
        return (f"pipeline_model_parallel_layout has {nt} decoder layers 't' but the model has num_layers={num_layers}"
                " (PAR-032)")
    nm = flat.count("m")
    if mtp is not None and nm != mtp:
        return f"pipeline_model_parallel_layout has {nm} MTP layers 'm' but the model has mtp_num_layers={mtp} (PAR-032)"
    if nm and "t" in flat[flat.index("m"):]:
        return "pipeline_model_parallel_layout: decoder layers must be placed before MTP (PAR-032)"
    return None


def _check_layout_stages(stages: Stages, pp: int, vpp: int | None, num_layers: int, mtp: int) -> int:
    """Validate a parsed layout against PP/VPP and the model; returns VPP. Mirrors ``validate_layer_layout``."""
    n = len(stages)
    if n % pp:
        raise LayoutError(
            f"pipeline_model_parallel_layout has {n} stages, not a multiple of pipeline_model_parallel_size={pp}"
            " (PAR-031)"
        )
    v = n // pp
    if vpp is not None and vpp != v:
        raise LayoutError(
            f"virtual_pipeline_model_parallel_size={vpp} but the layout has {n} stages / PP{pp} = {v} (PAR-031)"
        )
    msg = layout_contents_error(stages, num_layers, mtp)
    if msg:
        raise LayoutError(msg)
    if "m" in "".join(stages):
        holders = [i for i, s in enumerate(stages) if "m" in s]
        if len(holders) != 1:
            raise LayoutError("pipeline_model_parallel_layout: all MTP layers must be in one stage (PAR-032)")
        if holders[0] // pp != v - 1:
            raise LayoutError(
                "pipeline_model_parallel_layout: MTP must be in the last virtual stage of its PP rank (PAR-032)"
            )
    return v


def uneven_split_error(num_layers: int, pp: int, vpp: int, first: int | None, last: int | None) -> str | None:
    """What is wrong with a first/last-stage pipeline split, or None (PAR-028; MCore ``TransformerConfig``
    ``__post_init__`` uneven-PP checks): the given counts positive and divisible by VPP, the remaining layers spread
    evenly over the middle PP stages, a VPP-divisible count each. ``vpp`` is 1 when not interleaved."""
    rem, mid = num_layers, pp
    for name, val in (("num_layers_in_first_pipeline_stage", first), ("num_layers_in_last_pipeline_stage", last)):
        if val is None:
            continue
        if val <= 0:
            return f"{name}={val}: must be > 0 (PAR-028)"
        if val % vpp:
            return f"{name}={val} must be divisible by virtual_pipeline_model_parallel_size={vpp} (PAR-028)"
        rem -= val
        mid -= 1
    if rem < 0 or bool(rem) != bool(mid):
        return (f"uneven pipeline split leaves {rem} middle layers for {mid} middle stages"
                f" (num_layers={num_layers}, PP={pp}) (PAR-028)")
    if mid and rem % mid:
        return f"uneven pipeline split: {rem} middle layers not divisible by {mid} middle PP stages (PAR-028)"
    if mid and (rem // mid) % vpp:
        return (f"uneven pipeline split: {rem // mid} layers per middle PP stage not divisible by"
                f" virtual_pipeline_model_parallel_size={vpp} (PAR-028)")
    return None


def even_split_error(num_layers: int, pp: int, vpp: int, acc_e: bool = False, acc_l: bool = False) -> str | None:
    """What is wrong with an even pipeline split, or None: ``num_layers`` (+1 per embedding/loss slot when
    ``account_for_*_in_pipeline_split``) divisible by PP, then the per-rank count by VPP (PAR-026/PAR-027; MCore
    ``TransformerConfig.__post_init__`` and ``transformer_block.get_num_layers_to_build``)."""
    total = num_layers + int(acc_e) + int(acc_l)
    if total % pp:
        extra = " (+1 embedding, +1 loss slots)" if acc_e or acc_l else ""
        return f"num_layers={num_layers}{extra} is not divisible by pipeline_model_parallel_size={pp} (PAR-026)"
    if (total // pp) % vpp:
        return (f"{total // pp} layers per pipeline rank not divisible by virtual_pipeline_model_parallel_size={vpp}"
                " (number of model chunks must be the same on every stage) (PAR-027)")
    return None


def _uniform_counts(
    model_layers: int, pp: int, v: int, first: int | None, last: int | None, acc_e: bool, acc_l: bool
) -> list[int]:
    """Decoder layers per stage (stage order: i = vchunk*PP + pp_rank) without a layout string."""
    counts = [0] * (pp * v)
    if first is not None or last is not None:
        if acc_e or acc_l:
            raise LayoutError(
                "num_layers_in_first/last_pipeline_stage cannot be combined with"
                " account_for_embedding/loss_in_pipeline_split (PAR-029)"
            )
        msg = uneven_split_error(model_layers, pp, v, first, last)
        if msg:
            raise LayoutError(msg)
        mid = pp - (first is not None) - (last is not None)
        per_mid = (model_layers - (first or 0) - (last or 0)) // mid if mid else 0
        for p in range(pp):
            if p == 0 and first is not None:
                n = first
            elif p == pp - 1 and last is not None:
                n = last
            else:
                n = per_mid
            for c in range(v):
                counts[c * pp + p] = n // v
        return counts
    msg = even_split_error(model_layers, pp, v, acc_e, acc_l)
    if msg:
        raise LayoutError(msg)
    per_chunk = (model_layers + int(acc_e) + int(acc_l)) // pp // v
    counts = [per_chunk] * (pp * v)
    if acc_e:
        counts[0] -= 1
    if acc_l:
        counts[-1] -= 1
    if min(counts) < 0:
        raise LayoutError("not enough layers in the first/last virtual pipeline stage for embedding/loss (PAR-033)")
    return counts


class SplitFields(NamedTuple):
    """The Layout fields that place layers on pipeline ranks (all that :func:`pipeline_stages` reads): layouts that
    differ only in TP / CP / EP / ETP share one split."""

    pp: int
    vpp: int | None
    pipeline_layout: str | None
    num_layers_in_first_pipeline_stage: int | None
    num_layers_in_last_pipeline_stage: int | None
    account_for_embedding_in_pipeline_split: bool
    account_for_loss_in_pipeline_split: bool


#: where :func:`split_fields` keeps a layout's value: a non-field key of the frozen instance's ``__dict__``, like its
#: cached hash (:mod:`moetune.spec.base`: pydantic's equality and serialisation ignore it, ``model_copy`` and pickling
#: drop it)
_SPLIT_KEY = "_moetune_split"


def split_fields(layout: Layout) -> SplitFields:
    """:class:`SplitFields` of a layout, built once per (frozen) layout object: the perf models read it for every
    rank and job of a layout (the planner: ~50k calls per large request)."""
    d = layout.__dict__
    try:
        return d[_SPLIT_KEY]
    except KeyError:
        got = d[_SPLIT_KEY] = SplitFields(
            layout.pp, layout.vpp, layout.pipeline_layout, layout.num_layers_in_first_pipeline_stage,
            layout.num_layers_in_last_pipeline_stage, layout.account_for_embedding_in_pipeline_split,
            layout.account_for_loss_in_pipeline_split)
        return got


def stage_strings(model: ModelArch, layout: Layout | SplitFields) -> Stages:
    """The (validated) contents of every stage as a layout string, in stage order ``i = vchunk*PP + pp_rank``.

    Works for every split mechanism: an explicit layout is checked, the others are converted (embedding on stage 0,
    MTP and loss on the last stage).
    """
    f = layout if isinstance(layout, SplitFields) else split_fields(layout)
    return _stage_strings(model.num_layers, model.mtp_num_layers, *f)


@memo(maxsize=8192)
def _stage_strings(
    num_layers: int,
    mtp: int,
    pp: int,
    vpp: int | None,
    pl: str | None,
    first: int | None,
    last: int | None,
    acc_e: bool,
    acc_l: bool,
) -> Stages:
    """Cached core of :func:`stage_strings` on plain values (the planner calls it for many layouts)."""
    if vpp is not None and vpp > 1 and pp <= 1 and pl is None:
        raise LayoutError(
            f"virtual_pipeline_model_parallel_size={vpp} needs pipeline_model_parallel_size > 1 (PAR-006)"
        )
    if pl is not None:
        if first is not None or last is not None or acc_e or acc_l:
            raise LayoutError(
                "pipeline_model_parallel_layout cannot be combined with num_layers_in_first/last_pipeline_stage or"
                " account_for_embedding/loss_in_pipeline_split (PAR-030)"
            )
        stages = parse_pipeline_layout(pl)
        v = _check_layout_stages(stages, pp, vpp, num_layers, mtp)
        if v > 1 and pp <= 1:
            raise LayoutError(
                f"pipeline_model_parallel_layout gives {v} virtual stages but pipeline_model_parallel_size=1 (PAR-006)"
            )
        return stages
    v = vpp or 1
    counts = _uniform_counts(num_layers, pp, v, first, last, acc_e, acc_l)
    out = ["t" * c for c in counts]
    out[0] = "E" + out[0]
    out[-1] = out[-1] + "m" * mtp + "L"
    return tuple(out)


def pipeline_stages(model: ModelArch, layout: Layout | SplitFields) -> list[PipelineRank]:
    """Per PP rank, its virtual chunks with decoder layer indices, embedding / loss flags and MTP layers.

    Decoder ids are assigned in stage order (virtual chunk major, then PP rank), as MCore's ``get_layer_offset`` /
    ``get_transformer_layer_offset``. Raises :class:`LayoutError` naming the violated constraint.
    """
    stages = stage_strings(model, layout)
    pp = layout.pp
    v = len(stages) // pp
    ranks = [PipelineRank(pp_rank=p, chunks=[]) for p in range(pp)]
    nxt = 0
    for i, s in enumerate(stages):
        nt = s.count("t")
        ranks[i % pp].chunks.append(
            Chunk(
                vchunk=i // pp,
                layers=tuple(range(nxt, nxt + nt)),
                embedding="E" in s,
                loss="L" in s,
                mtp_layers=s.count("m"),
            )
        )
        nxt += nt
    assert all(len(r.chunks) == v for r in ranks)
    return ranks


def effective_vpp(model: ModelArch, layout: Layout) -> int:
    """VPP after applying the layout string (1 = not interleaved)."""
    return len(stage_strings(model, layout)) // layout.pp
