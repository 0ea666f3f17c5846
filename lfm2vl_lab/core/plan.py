"""Which items replay together, and what that costs: the manager's planner, pure host logic.

:func:`plan_batches` packs a call's items into replay batches (largest first, under the largest
budget and the item limit); :func:`plan_config` does it with a config's limits
(:meth:`~.protocol.GraphConfig.plan`, as :meth:`~.manager.EncoderGraphManager.encode` plans);
:func:`plan_stats` previews, on the host only, what a stream of calls would do to the counters
(replays, padding, items left to eager).
"""

from __future__ import annotations


def plan_batches(tokens: list[int], max_budget: int, max_items: int, run_tokens: int | None = None,
                 max_run_items: int = 0) -> tuple[list[list[int]], list[int]]:
    """Greedy packing of item indices into replay batches.

    Items are taken largest first; a batch grows while its tokens stay ≤ ``max_budget`` and its
    items < ``max_items``. Items larger than ``max_budget`` are returned separately (eager).

    Runs: a batch made only of items of exactly ``run_tokens`` tokens (full-length items, which come
    first because they are the largest) may instead grow to ``max_run_items`` items, so 8 tiles make
    one replay with large GEMMs, not two. It closes at the first other item that would break the
    regular limits; the rest is packed as usual.
    """
    order = sorted(range(len(tokens)), key=lambda i: -tokens[i])
    eager = [i for i in order if tokens[i] > max_budget]
    batches: list[list[int]] = []
    cur: list[int] = []
    cur_tokens, pure = 0, True  # pure: every item of cur is a full-length run item
    for i in order:
        if tokens[i] > max_budget:
            continue
        run = run_tokens is not None and tokens[i] == run_tokens
        regular_full = cur_tokens + tokens[i] > max_budget or len(cur) >= max_items
        full = regular_full and not (pure and run and len(cur) < max_run_items)
        if cur and full:
            batches.append(cur)
            cur, cur_tokens, pure = [], 0, True
        cur.append(i)
        cur_tokens += tokens[i]
        pure = pure and run
    if cur:
        batches.append(cur)
    return batches, eager


def plan_config(tokens: list[int], config) -> tuple[list[list[int]], list[int]]:
    """:func:`plan_batches` with a config's limits (:meth:`~.protocol.GraphConfig.plan`): its largest
    budget, its item limit and its runs (``run_tokens``, ``run_items``), as the manager plans a call."""
    return config.plan(tokens)


def plan_stats(calls: list[list[int]], config, dense_runs: bool = True) -> dict:
    """Host-only preview of what a config does to a stream of calls (each a list of item tokens):
    replays, real and padded tokens, items left to eager, and the padding waste (padded / real).
    ``dense_runs``: a batch made only of ``config.run_tokens``-token items runs graphs that compute
    exactly its items (LFM2-VL's dense graphs), so it pads nothing."""
    replays = real = padded = eager_items = 0
    run_tokens = config.run_tokens
    for toks in calls:
        batches, eager = plan_config(toks, config)
        eager_items += len(eager)
        for b in batches:
            t = sum(toks[i] for i in b)
            exact = dense_runs and run_tokens is not None and all(toks[i] == run_tokens for i in b)
            replays, real, padded = replays + 1, real + t, padded + (0 if exact else config.budget_for(t, len(b)) - t)
    return {"replays": replays, "real": real, "padded": padded, "eager_items": eager_items,
            "waste": padded / real if real else 0.0}
