"""The A/B inside vLLM: what is compared, in which order, and how the numbers are read.

Nothing here imports vLLM or touches a GPU, so all of it is tested on a CPU; the measuring itself is
:mod:`.vllm_preset` (one preset in one process) and :mod:`.vllm_engine` (vLLM's engines and hooks).

* **Arms** (:data:`ARMS`): ``off``, vLLM's default engine; ``pr``, the same with encoder CUDA graphs
  and the graph config vLLM PR #44930 was measured with; ``kit``, the same with the kit's default
  budgets and item limit (:func:`compilation_config` writes each from the kit's one definition of
  the graph configs, :data:`lfm2vl_lab.core.config.GRAPH_CONFIGS`).
* **Cases** (:data:`CASES` × :data:`TOKENS`): one 512 px image, one tiled 1024×768 image, and four
  requests of one 512 px image each at once; whole requests of 16 and of 128 output tokens, whose
  first token gives the time to first token (TTFT).
* **Rounds**: each round runs every case once per arm, the arms in a rotating order
  (:func:`round_orders`), so a drift of the machine lands on every arm alike, and round ``i`` of one
  arm is paired with round ``i`` of another. Every request carries a new image, so neither vLLM's
  processor cache nor its encoder cache can answer it.
* **Cuts** (:func:`paired_cut`): per round, ``1 - graphed / off``; the cut is the median over rounds,
  with a bootstrap confidence interval of that median, so a cut whose interval holds 0 reads as no
  measurable change.
"""

from __future__ import annotations

import random
import statistics

from ..core.config import GraphOptions, auto_budgets, auto_max_items
from ..model.presets import as_preset

# the PR's own model first: where a call runs out of time, the preset the PR measured is recorded
PRESETS = ("lfm2-vl-3b", "lfm2-vl-450m", "lfm2-vl-1.6b")
ARMS = ("off", "pr", "kit")
GRAPHED_ARMS = ARMS[1:]
# (image, requests): the sizes are measure/e2e.py's IMAGES
CASES = (("1x512", 1), ("tiled", 1), ("1x512", 4))
TOKENS = (16, 128)
PROMPT_TEXT = "Describe this image."
PARITY_IMAGES = ("1x512", "tiled")
PARITY_TOKENS = 16
TOP_LOGITS = 20  # the logits vLLM returns per parity request: its 20 most likely tokens
CONFIDENCE = 0.95


def compilation_config(arm: str, preset: str) -> dict:
    """vLLM's ``compilation_config`` of ``arm`` for ``preset``: ``off`` leaves encoder graphs off;
    ``pr`` and ``kit`` turn them on with the budgets and item limit of that named graph config. The
    kit's own config leaves both automatic; written out for vLLM they are the doubling budgets from
    the preset's smallest item to :attr:`GraphOptions.max_budget` and vLLM's automatic item limit
    (the rules the kit shares with vLLM: ``tests/test_vllm_parity.py``)."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; the arms are {', '.join(ARMS)}")
    if arm == "off":
        return {"cudagraph_mm_encoder": False}
    opts = GraphOptions.named(arm)
    smallest = as_preset(preset).min_image_tokens
    budgets = list(opts.budgets) if opts.budgets else auto_budgets(smallest, opts.max_budget)
    items = opts.max_items if opts.max_items is not None else auto_max_items(budgets, smallest)
    return {"cudagraph_mm_encoder": True, "encoder_cudagraph_token_budgets": budgets,
            "encoder_cudagraph_max_vision_items_per_batch": items}


# vLLM 0.25.1's LFM2-VL processor counts a thumbnail for every tiled image (lfm2_vl.py:
# `_get_image_feature_grid_size` adds one patch whenever the grid is larger than 1x1, and
# `get_image_repl` appends the thumbnail's tokens, sized from the last item), whatever the image
# processor's `use_thumbnail` says. Where it says no (LFM2-VL-450M), a tiled prompt gets one item's
# placeholders more than the encoder returns, and the engine dies on the first tiled request
# ("Attempted to assign 1536 = 1536 multimodal tokens to 1792 placeholders").
NO_THUMBNAIL = ("vLLM 0.25.1's LFM2-VL processor counts a thumbnail for every tiled image, and this preset's "
                "processor makes none (use_thumbnail: false): its engine dies on a tiled request")


def vllm_cases(preset: str) -> tuple[list[tuple[str, int]], dict[str, str]]:
    """The :data:`CASES` vLLM can serve for ``preset``, and the ones it cannot with the reason (see
    :data:`NO_THUMBNAIL`); the kit's pipeline runs every case."""
    if as_preset(preset).processor.get("use_thumbnail", True):
        return list(CASES), {}
    return [c for c in CASES if c[0] != "tiled"], {"tiled": NO_THUMBNAIL}


def round_orders(arms, rounds: int) -> list[list[str]]:
    """The arms' order in each round: rotated by one each round (off, pr, kit; pr, kit, off; ...)."""
    arms = list(arms)
    return [arms[i % len(arms):] + arms[: i % len(arms)] for i in range(rounds)]


def _median_ci(values: list[float], seed: int, resamples: int, level: float) -> tuple[float, float]:
    rng = random.Random(seed)
    n = len(values)
    meds = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(resamples))
    lo = meds[int((1 - level) / 2 * resamples)]
    hi = meds[min(int((1 + level) / 2 * resamples), resamples - 1)]
    return lo, hi


def paired_cut(base: list[float], new: list[float], seed: int = 0, resamples: int = 2000,
               level: float = CONFIDENCE) -> dict:
    """The saving of ``new`` against ``base``, pair by pair: ``cut`` is the median over rounds of
    ``1 - new_i / base_i``; ``ci`` its bootstrap ``level`` interval (``resamples`` resamples of the
    rounds, seeded, so the same samples always give the same interval); ``n`` the pairs."""
    if len(base) != len(new) or not base:
        raise ValueError(f"paired_cut needs two equally long, non-empty sample lists; got {len(base)} and {len(new)}")
    if min(base) <= 0 or min(new) <= 0:
        raise ValueError("paired_cut needs positive times")
    cuts = [1 - n / b for b, n in zip(base, new)]
    lo, hi = _median_ci(cuts, seed, resamples, level)
    return {"cut": statistics.median(cuts), "ci": [lo, hi], "level": level, "n": len(cuts)}


def spread(samples: list[float]) -> dict:
    """How a sample list spreads: median, 10th and 90th percentile, and the interquartile range
    over the median (the relative spread a reader can set a cut against)."""
    if not samples:
        raise ValueError("spread needs at least one sample")
    med = statistics.median(samples)
    if len(samples) == 1:
        return {"median": med, "p10": med, "p90": med, "iqr_rel": 0.0, "n": 1}
    qs = statistics.quantiles(samples, n=20, method="inclusive")  # the 5th, 10th, ..., 95th percentiles
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return {"median": med, "p10": qs[1], "p90": qs[17], "iqr_rel": (q3 - q1) / med if med else None,
            "n": len(samples)}


def case_name(image: str, requests: int) -> str:
    return f"{requests}x{image.removeprefix('1x')}" if requests > 1 else image


def case_rows(preset: str, image: str, requests: int, tokens: int, samples: dict[str, dict[str, list[float]]],
              seed: int = 0) -> list[dict]:
    """The rows of one case from its rounds: ``samples[arm]["ttft_ms" | "e2e_ms"]`` in round order.
    Each arm's row has the medians and spread; each graphed arm's row the paired cuts of TTFT and
    of the whole request against ``off``."""
    rows = []
    for arm, s in samples.items():
        row = {"preset": preset, "image": image, "requests": requests, "case": case_name(image, requests),
               "tokens": tokens, "arm": arm, "rounds": len(s["e2e_ms"]),
               "ttft_ms": statistics.median(s["ttft_ms"]), "e2e_ms": statistics.median(s["e2e_ms"]),
               "ttft_spread": spread(s["ttft_ms"]), "e2e_spread": spread(s["e2e_ms"])}
        if arm != "off" and "off" in samples:
            row["ttft_cut"] = paired_cut(samples["off"]["ttft_ms"], s["ttft_ms"], seed)
            row["e2e_cut"] = paired_cut(samples["off"]["e2e_ms"], s["e2e_ms"], seed)
        rows.append(row)
    return rows


def breakdown(requests: list[dict], encoder_calls: list[dict]) -> dict:
    """Where one arm's TTFT went, from vLLM's own timestamps and the worker's encoder events, medians
    over requests: the processor (vLLM's timing, on the host before the engine sees the request), the
    wait for a scheduler step, the step(s) up to the first token (encoder, prefill and sampling on
    the GPU), the encoder's share of those on the GPU stream, and what is left (the frontend and the
    pipe between the processes): composed, ``ttft - processor - queue - step``."""
    def med(key):
        vals = [r[key] for r in requests if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    out = {k: med(k) for k in ("ttft_ms", "processor_ms", "queue_ms", "scheduled_to_first_ms")}
    enc = [c["gpu_ms"] for c in encoder_calls]
    out["encoder_gpu_ms"] = statistics.median(enc) if enc else None
    out["encoder_host_ms"] = statistics.median([c["host_ms"] for c in encoder_calls]) if enc else None
    parts = [out[k] for k in ("processor_ms", "queue_ms", "scheduled_to_first_ms")]
    out["rest_ms_composed"] = out["ttft_ms"] - sum(parts) if None not in parts and out["ttft_ms"] else None
    return out
