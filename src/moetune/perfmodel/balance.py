"""FLOPs-balanced pipeline layouts: the ``pipeline_model_parallel_layout`` the planner generates and ``estimate``
uses when PP (x VPP) does not divide the decoder layers and no split was given.

Sources: Megatron-Core ``megatron/core/transformer/pipeline_parallel_layer_layout.py`` (``PipelineParallelLayerLayout``:
embedding first, MTP + loss last, stage *k* on PP rank ``k % PP``) and the FLOPs of :mod:`moetune.perfmodel.flops`.
"""

from __future__ import annotations

from moetune.memo import memo
from moetune.spec.model import ModelArch


def stage_weights(model: ModelArch, seq: int) -> tuple[tuple[float, ...], float, float]:
    """Forward FLOPs per token that a pipeline stage takes on with each piece it holds: (per decoder layer, per MTP
    depth incl. its output layer, output layer + loss). The embedding lookup is a gather (no FLOPs).

    Sources: :func:`moetune.perfmodel.flops.layer_flops` (router excluded, as in Bridge's model FLOPs),
    :func:`~moetune.perfmodel.flops.mtp_depth_flops` and :func:`~moetune.perfmodel.flops.logits_flops` (one head
    per output: the main one and one per MTP depth).
    """
    from moetune.perfmodel.flops import layer_flops, logits_flops, mtp_depth_flops

    layers = tuple(sum(v for k, v in layer_flops(model, i, seq).items() if k != "router")
                   for i in range(model.num_layers))
    head = logits_flops(model) / (1 + model.mtp_num_layers)
    mtp = sum(mtp_depth_flops(model, seq).values()) + head if model.mtp_num_layers else 0.0
    return layers, mtp, head


@memo(maxsize=4096)
def balanced_layout(num_layers: int, stages: int, mtp_layers: int, *, pp: int | None = None,
                    layer_weights: tuple[float, ...] | None = None, mtp_weight: float | None = None,
                    loss_weight: float | None = None, embedding_weight: float = 1.0) -> str | None:
    """A Megatron ``pipeline_model_parallel_layout`` that balances the forward work of the PP ranks: the embedding on
    the first virtual stage, the MTP layers + output layer + loss on the last (MCore ``PipelineParallelLayerLayout``
    rules), the decoder layers split contiguously with the first and last stage sizes chosen to minimise the most
    loaded PP rank (virtual stage *k* runs on rank ``k % pp``), the middle stages as even as possible.

    ``layer_weights`` / ``mtp_weight`` / ``loss_weight`` / ``embedding_weight`` are the work of each piece
    (:func:`stage_weights`; the planner passes 0 for the embedding gather); by default every decoder layer, MTP depth,
    the embedding and the loss count as one layer each - the ``account_for_embedding/loss_in_pipeline_split``
    convention of Megatron-Core. Ties keep the most even split.

    Returns None when no layout string is needed: no MTP and the uniform split is already optimal.
    """
    if stages <= 1 or num_layers < 1:
        return None
    pp = pp or stages
    w = layer_weights or (1.0,) * num_layers
    w_mtp = (1.0 if mtp_weight is None else mtp_weight) * mtp_layers
    w_loss = 1.0 if loss_weight is None else loss_weight
    prefix = [0.0]
    for x in w:
        prefix.append(prefix[-1] + x)
    mids = stages - 2
    q = num_layers // stages

    def counts_for(first: int, last: int) -> list[int] | None:
        rest = num_layers - first - last
        if rest < 0 or (mids == 0 and rest) or (mids > 0 and rest < mids):
            return None
        if mids == 0:
            return [first, last]
        qm, rm = divmod(rest, mids)
        return [first, *[qm + (1 if i < rm else 0) for i in range(mids)], last]

    def cost(counts: list[int]) -> tuple[float, float, int]:
        ranks = [0.0] * pp
        worst_stage = 0.0
        at = 0
        for k, c in enumerate(counts):
            load = prefix[at + c] - prefix[at] + (w_mtp + w_loss if k == stages - 1 else 0.0) + (
                embedding_weight if k == 0 else 0.0)
            at += c
            ranks[k % pp] += load
            worst_stage = max(worst_stage, load)
        return (round(max(ranks), 6), round(worst_stage, 6), max(counts) - min(counts))

    uniform = [q] * stages if num_layers % stages == 0 else None
    best: tuple | None = None
    best_counts: list[int] | None = None
    if uniform is not None:
        best, best_counts = cost(uniform), uniform
    hi = min(num_layers, 2 * q + 2)
    for first in range(hi + 1):
        for last in range(hi + 1):
            counts = counts_for(first, last)
            if counts is None:
                continue
            c = cost(counts)
            if best is None or c < best:
                best, best_counts = c, counts
    if best_counts is None:
        return None
    if best_counts == uniform and mtp_layers == 0:
        return None
    parts = []
    for i, c in enumerate(best_counts):
        s = ("E" if i == 0 else "") + "t" * c
        if i == stages - 1:
            s += "m" * mtp_layers + "L"
        parts.append(s)
    return "|".join(parts)
