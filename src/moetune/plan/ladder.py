"""Containment between the options of the planner's recompute ladder, for the bound that ends a layout's ladder early
(:meth:`moetune.plan.search.Search.ladder_rest_pruned`).

The step model prices recompute as additions only (:func:`moetune.perfmodel.step._price`,
:func:`moetune.perfmodel.step._price_layer`): a selective option adds, per layer kind, the forward seconds of the
work rows whose tag it recomputes (:func:`moetune.perfmodel.step.recompute_selection`: tag -> fraction) plus
``recompute_a2a`` x one EP dispatch/combine; full recompute adds ``full_frac`` x the whole forward (every tag) plus
``2 x full_frac`` dispatch/combines. Every added term is >= 0, and nothing else of a stage's time floor (compute, TP,
CP) depends on the recompute option. So where option ``small`` recomputes a subset of what option ``big`` recomputes
(:func:`contains`), every stage's recompute seconds under ``big`` are at least those under ``small`` for the same
layout and dispatcher, and a lower bound on the step time of ``small``'s variants built from the stage floors
(:func:`moetune.plan.search._schedule_floor`) bounds ``big``'s variants too.
"""

from __future__ import annotations

from typing import Any

from moetune.perfmodel.step import recompute_selection
from moetune.spec.features import Features

#: what :func:`recompute_terms` returns for full recompute of every layer (uniform method): it adds the whole forward
#: and two dispatch/combines per MoE layer, at least what any option adds
EVERYTHING = "everything"


def recompute_terms(rec: dict[str, Any]) -> Any:
    """What recompute option ``rec`` (a :func:`moetune.plan.search._recompute_options` update) adds to a layer's
    recompute seconds, as :func:`moetune.perfmodel.step.recompute_selection` reads it: ``(tag -> fraction, recompute
    A2As per MoE layer)``; :data:`EVERYTHING` for uniform full recompute (``full_frac`` = 1: the whole forward, 2
    A2As); None for block full recompute (its fraction depends on the layout: comparable with nothing)."""
    f = Features().model_copy(update=rec)
    if f.recompute_granularity == "full":
        return EVERYTHING if f.recompute_method != "block" else None
    rf, rec_a2a, full_frac, _ = recompute_selection(f, 1, 1)
    return (dict(rf), rec_a2a)


def contains(big: Any, small: Any) -> bool:
    """Whether the option with :func:`recompute_terms` ``big`` adds at least every recompute term of ``small`` (each
    tag at least at ``small``'s fraction, at least as many A2As): then its recompute seconds are at least
    ``small``'s on every stage (module docstring)."""
    if big is None or small is None:
        return False
    if big == EVERYTHING:
        return True
    if small == EVERYTHING:
        return False
    (big_tags, big_a2a), (small_tags, small_a2a) = big, small
    return small_a2a <= big_a2a and all(big_tags.get(t, 0.0) >= frac for t, frac in small_tags.items())


def ladder_cores(options: list[tuple[int, dict[str, Any]]]) -> list[bool]:
    """Per option of the ladder ``options`` (:func:`moetune.plan.search._recompute_options`, in order): whether every
    later option recomputes at least what it does (:func:`contains`), so that a lower bound on its variants bounds
    the variants of the rest of the ladder."""
    terms = [recompute_terms(rec) for _, rec in options]
    return [terms[j] is not None and all(contains(t, terms[j]) for t in terms[j + 1:]) for j in range(len(terms))]
