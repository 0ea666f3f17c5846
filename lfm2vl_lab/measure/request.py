"""Whole requests, the way vLLM PR #44930 stated its claim, and an offline-throughput run.

The PR's "~10-20% lower e2e latency at low batch size" is about whole requests (processor, upload,
encoder, prefill and every output token) inside vLLM's engine, whose text model runs under CUDA
graphs. Here the kit's pipeline (:mod:`lfm2vl_lab.serving.pipeline`) runs them in vLLM's place,
and every file and table made from this module says so (:data:`STAND_IN`); vLLM's own engine is
measured by ``python -m lfm2vl_lab vllm`` (:mod:`.cli_vllm`).

For each grid cell (image × requests), on top of the TTFT grid's four rows (:func:`.ttft.cell_rows`):

* **text graphed** (the PR's setting): whole requests of ``new_tokens`` output tokens, timed in
  turns with the encoder eager and graphed, from the processor to the tokens on the host:
  ``e2e_ms`` is measured, and ``e2e_cut`` is the encoder graphs' paired saving.
* **text eager** (transformers' own text model): a whole request of 128 tokens takes seconds there,
  since its eager decode is slow per step (the ``ttft`` grid's ``decode_ms_per_token``), so its
  ``e2e_ms`` is composed from the same cell's measured parts,
  ``request_ms + (new_tokens - 1) × decode_ms_per_token``. The text-graphed rows
  carry the same composition (``e2e_composed_ms``) beside their measured whole request, which checks it.

:func:`throughput_run` is in the spirit of ``vllm bench throughput``: a fixed set of requests (the
seeded workload's mixed image sizes, :func:`.workloads.synthetic_workload`), run in arrival order
in batches of up to ``batch`` requests of ``new_tokens`` tokens each, with the text model graphed.
It reports requests and output tokens per second with the encoder eager and graphed, the passes in
turns.
"""

from __future__ import annotations

import statistics

import torch

from ..model.inputs import process_images
from ..serving.cache import bucket_len
from ..serving.pipeline import MODES
from .e2e import build_prompt, grid_rows, paired_reduction
from .floor import TARGETS as ENCODER_TARGETS
from .timing import time_paired
from .ttft import PhaseClock, build_pipelines, cell_rows, median_phases, mode_name, prompt_for, request_call
from .workloads import synthetic_workload

STAND_IN = ("the kit's pipeline (lfm2vl_lab.serving.pipeline) in place of vLLM's engine; vLLM's own "
            "engine is measured by python -m lfm2vl_lab vllm")
NEW_TOKENS = 128  # output tokens per whole request
THROUGHPUT_BATCH = 8  # the most requests one batch of the throughput run carries
PAD_ID = 0  # right padding of the shorter prompts in a throughput batch (never read: lengths say where each ends)
# The targets judged from a request file, stated once. The PR's budget set is held to the one capture
# limit of every encoder graph set the kit captures (floor.TARGETS, its own budgets on each preset):
# capture is a start-up cost whichever budgets it serves, and a larger set is no reason to allow more.
TARGETS = {"pr_capture_s": ENCODER_TARGETS["capture_s"]}
CAPTURE_GOAL = "the PR's budget set captures in s"  # the goal's name, before its preset


def composed_e2e(row: dict, tokens: int) -> float:
    """A whole request of ``tokens`` output tokens composed from a TTFT row's measured parts: the
    request to its first token (processor included), then ``tokens - 1`` decode steps."""
    return row["request_ms"] + (tokens - 1) * row["decode_ms_per_token"]


def composition_check(eager: dict, graphed: dict) -> dict | None:
    """Where a cell's whole requests were measured with the encoder eager and graphed, the same cell
    composed from its parts (``e2e_composed_ms``) beside them: how far the composition is off. None
    where either row is not measured (there is nothing to check it against).

    ``composed_ms``: (eager, graphed); ``ms_error``: each composed / measured - 1; ``cut``: the cut the
    composition gives; ``cut_error``: that cut less the measured (paired) one, in fractions (×100: points).
    """
    if eager.get("e2e_source") != "measured" or graphed.get("e2e_source") != "measured":
        return None
    ce, cg = eager["e2e_composed_ms"], graphed["e2e_composed_ms"]
    cut = 1 - cg / ce
    return {"composed_ms": (ce, cg), "ms_error": (ce / eager["e2e_ms"] - 1, cg / graphed["e2e_ms"] - 1),
            "cut": cut, "cut_error": cut - graphed["e2e_cut"]}


def whole_request_rows(model, pipes: dict, image: str, n: int, repeats: int, decode_tokens: int,
                       new_tokens: int = NEW_TOKENS) -> list[dict]:
    """The four TTFT rows of one cell, each with its whole-request latency (see the module)."""
    rows = {r["mode"]: r for r in cell_rows(model, pipes, image, n, repeats, decode_tokens)}
    images, ids = prompt_for(model, image, n)
    graphed = {m: p for m, p in pipes.items() if p.text_mode == "graphed"}
    clock = PhaseClock(model.device)
    logs = {m: [] for m in graphed}
    calls = {m: request_call(p, images, ids, new_tokens, clock, logs[m]) for m, p in graphed.items()}
    totals = time_paired(calls, repeats, 1, model.device)
    for m, r in rows.items():
        r["e2e_tokens"] = new_tokens
        r["e2e_composed_ms"] = composed_e2e(r, new_tokens)
        if m in totals:
            r.update(e2e_source="measured", e2e_ms=statistics.median(totals[m]), e2e_samples_ms=totals[m],
                     e2e_phases_ms=median_phases(logs[m], repeats))
        else:
            r.update(e2e_source="composed", e2e_ms=r["e2e_composed_ms"])
    for t in MODES:
        eager, g = rows[mode_name(t, "eager")], rows[mode_name(t, "graphed")]
        if "e2e_samples_ms" in eager and "e2e_samples_ms" in g:
            g["e2e_cut"] = paired_reduction(eager["e2e_samples_ms"], g["e2e_samples_ms"])
        else:
            g["e2e_cut"] = 1 - g["e2e_ms"] / eager["e2e_ms"]
    both, ref = mode_name("graphed", "graphed"), mode_name("graphed", "eager")
    rows[both]["same_e2e_tokens"] = bool((logs[both][-1][1] == logs[ref][-1][1]).all())
    return list(rows.values())


def run_requests(model, genc, engine, images=("1x512", "tiled"), requests=(1, 2, 4), repeats: int = 5,
                 decode_tokens: int = 16, new_tokens: int = NEW_TOKENS, progress: bool = True,
                 on_row=None) -> list[dict]:
    """The grid's rows for one model with whole requests: every image × request count × the four modes."""
    if repeats < 1 or decode_tokens < 1 or new_tokens < 2 or min(requests, default=0) < 1:
        raise ValueError(f"need repeats, decode_tokens, every request count >= 1 and new_tokens >= 2; got "
                         f"repeats={repeats}, decode_tokens={decode_tokens}, new_tokens={new_tokens}, "
                         f"requests={list(requests)}")
    pipes = build_pipelines(model, genc, engine)
    return grid_rows([(im, n) for im in images for n in requests], "whole requests",
                     lambda im, n: whole_request_rows(model, pipes, im, n, repeats, decode_tokens, new_tokens),
                     progress, on_row)


# --------------------------------------------------------------------------------------------
# Offline throughput
# --------------------------------------------------------------------------------------------


def request_prompt(model, image) -> torch.Tensor:
    """One request's prompt ids (host): the kit's chat-turn text around its image's tokens."""
    return build_prompt(model, process_images([image], model), 1)["input_ids"][0].cpu()


def throughput_set(model, requests: int, max_prompt: int, seed: int = 0) -> tuple[list, list[torch.Tensor], int]:
    """``requests`` requests of the seeded workload, in its order, keeping those whose prompt has at
    most ``max_prompt`` ids (what the text engine holds with the output tokens): their images, their
    prompts, and how many were passed over."""
    images, prompts, skipped = [], [], 0
    for req in synthetic_workload(8 * requests, seed):
        if len(images) == requests:
            break
        img = req.image()
        ids = request_prompt(model, img)
        if ids.numel() > max_prompt:
            skipped += 1
            continue
        images.append(img)
        prompts.append(ids)
    if len(images) < requests:
        raise ValueError(f"only {len(images)} of the workload's requests fit prompts of {max_prompt} ids; "
                         f"asked for {requests}")
    return images, prompts, skipped


def batch_prompts(prompts: list[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
    """Prompts of different lengths as one right-padded ``[requests, longest]`` id tensor, and their lengths."""
    lengths = [int(p.numel()) for p in prompts]
    ids = torch.full((len(prompts), max(lengths)), PAD_ID, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, : p.numel()] = p
    return ids, lengths


def throughput_run(model, pipes: dict, engine, requests: int = 32, batch: int = THROUGHPUT_BATCH,
                   new_tokens: int = NEW_TOKENS, passes: int = 3, seed: int = 0) -> dict:
    """The offline-throughput run (see the module): the text-graphed pipelines of ``pipes``, each
    pass over the whole set timed on the host, the encoder modes in turns. Captures the text
    engine's graphs for the set's batch shapes first (their seconds are in ``capture``)."""
    if requests < 1 or batch < 1 or passes < 1 or new_tokens < 2:
        raise ValueError(f"need requests, batch and passes >= 1 and new_tokens >= 2; got requests={requests}, "
                         f"batch={batch}, passes={passes}, new_tokens={new_tokens}")
    if batch > engine.max_batch:
        raise ValueError(f"batches of {batch} requests do not fit the text engine's max_batch={engine.max_batch}")
    images, prompts, skipped = throughput_set(model, requests, engine.max_len - new_tokens, seed)
    batches = [(images[i:i + batch], *batch_prompts(prompts[i:i + batch])) for i in range(0, requests, batch)]
    capture = None
    if model.device.type == "cuda":
        capture = engine.capture([(len(lens), max(lens)) for _, _, lens in batches])
    graphed = {m: p for m, p in pipes.items() if p.text_mode == "graphed"}

    def one_pass(pipe):
        def call():
            for imgs, ids, lens in batches:
                pipe.run(ids, process_images(imgs, model), new_tokens, lengths=lens).cpu()
        return call

    walls = time_paired({m: one_pass(p) for m, p in graphed.items()}, passes, 1, model.device)
    modes = {}
    for m, ms in walls.items():
        s = statistics.median(ms) / 1e3
        modes[m] = {"pass_ms": ms, "pass_s": s, "requests_per_s": requests / s,
                    "tokens_per_s": requests * new_tokens / s}
    eager, both = modes[mode_name("graphed", "eager")], modes[mode_name("graphed", "graphed")]
    return {"requests": requests, "batch": batch, "new_tokens": new_tokens, "passes": passes, "seed": seed,
            "skipped_too_long": skipped, "image_sizes": [list(im.size) for im in images],
            "prompt_lens": [int(p.numel()) for p in prompts],
            "padded_lens": [bucket_len(max(lens)) for *_, lens in batches],
            "capture": capture, "modes": modes, "speedup": eager["pass_s"] / both["pass_s"], "stand_in": STAND_IN}


# --------------------------------------------------------------------------------------------
# What a run prints and judges
# --------------------------------------------------------------------------------------------


def e2e_line(row: dict) -> str | None:
    """A row's whole request as one line (None for a row without one)."""
    if "e2e_ms" not in row:
        return None
    cut = f", encoder-graph cut {100 * row['e2e_cut']:.1f}%" if "e2e_cut" in row else ""
    return f"    whole request of {row['e2e_tokens']} tokens: {row['e2e_ms']:.1f} ms ({row['e2e_source']}){cut}"


def print_throughput(tp: dict) -> None:
    """The throughput run as a few lines."""
    print(f"throughput {tp['preset']}: {tp['requests']} requests in batches of up to {tp['batch']}, "
          f"{tp['new_tokens']} tokens each ({STAND_IN})", flush=True)
    for m, r in tp["modes"].items():
        print(f"  {m:>28}  {r['requests_per_s']:.2f} requests/s  {r['tokens_per_s']:.0f} tokens/s", flush=True)
    print(f"  encoder graphs: {tp['speedup']:.3f}x the throughput", flush=True)


def judge_requests(result: dict) -> list[dict]:
    """The request file's own targets: where the PR's budget set ran on a GPU, its capture time (the
    graphs' memory in its note). A goal here is one a measurement can miss; whether the rows were
    recorded at all is the run's output, not a goal."""
    from .results import target_row

    out = []
    for setup in result.get("setup", []):
        preset = setup["preset"]
        cap = setup.get("encoder_capture")
        if setup.get("graph_config") == "pr" and cap:
            secs = sum(r["capture_s"] for r in cap)
            mib = sum(r["total_mb"] for r in cap)
            lim = TARGETS["pr_capture_s"]
            out.append(target_row(f"{CAPTURE_GOAL}, {preset}", secs, lim, secs <= lim, f"graphs hold {mib:.0f} MiB"))
    return out


# Rows that files recorded before :func:`judge_requests` dropped them judged: they said only that
# something was recorded, so no measurement could miss them.
NOT_GOALS = ("whole requests at 1, 2 and 4 requests", "the PR's budget set's graph memory is reported")


def goals_of(result: dict) -> list[dict]:
    """A request file's goals as docs/goals.md shows them: its stored ``targets`` less :data:`NOT_GOALS`,
    with the capture time judged against today's :data:`TARGETS` (a file recorded under another limit
    keeps that limit as ``recorded_limit``)."""
    out = []
    for t in result.get("targets") or []:
        if t["target"].startswith(NOT_GOALS):
            continue
        lim = TARGETS["pr_capture_s"]
        if t["target"].startswith(CAPTURE_GOAL) and t["value"] is not None and t["limit"] != lim:
            t = dict(t, limit=lim, ok=t["value"] <= lim, recorded_limit=t["limit"])
        out.append(t)
    return out


# --------------------------------------------------------------------------------------------
# The PR's claim, like for like
# --------------------------------------------------------------------------------------------

PR_CLAIM_TEXT = "10–20%"  # "~10-20% lower e2e latency for low batch size" (vLLM PR #44930)


def e2e_cuts(rows: list[dict], preset: str, image: str, text_mode: str = "graphed") -> dict[int, float]:
    """The encoder graphs' whole-request cut per request count, for one preset, image and text mode."""
    want = mode_name(text_mode, "graphed")
    return {r["requests"]: r["e2e_cut"] for r in rows
            if (r["preset"], r["image"], r["mode"]) == (preset, image, want) and "e2e_cut" in r}


def like_for_like(result: dict, preset: str = "lfm2-vl-3b") -> str:
    """The PR's claim beside the kit's measurement of it, as one sentence computed from a request file."""
    rows = result["rows"]
    tokens = next((r["e2e_tokens"] for r in rows if "e2e_tokens" in r), None)
    cuts = {im: e2e_cuts(rows, preset, im) for im in ("1x512", "tiled")}
    if tokens is None or not cuts["1x512"]:
        return f"No whole-request rows of {preset} in this file."

    def listed(c: dict[int, float]) -> str:
        return ", ".join(f"{100 * v:.1f}% at {n} request{'s' if n > 1 else ''}" for n, v in sorted(c.items()))

    setup = next((s for s in result.get("setup", []) if s["preset"] == preset), {})
    config = "the PR's graph config" if setup.get("graph_config") == "pr" else "the kit's graph config"
    tiled = f"; with one tiled image each, {listed(cuts['tiled'])}" if cuts["tiled"] else ""
    return (f"On {preset.upper()} with {config}, whole requests of {tokens} output tokens with the text model "
            f"graphed: encoder graphs cut the latency by {listed(cuts['1x512'])} with one 512 px image each{tiled}. "
            f"The PR claimed {PR_CLAIM_TEXT}. The kit's pipeline runs in vLLM's place here, with random weights "
            "of the model's shapes.")


def e2e_text(result: dict, preset: str = "lfm2-vl-3b") -> str:
    """A request file's whole requests as lines: per image and request count, encoder eager → graphed
    at each text mode, with the cut and where the number comes from (measured or composed); where it
    was measured, the cut the composition from parts gives and how far that is off."""
    lines = []
    cells = sorted({(r["image"], r["requests"]) for r in result["rows"] if r["preset"] == preset and "e2e_ms" in r})
    for image, n in cells:
        by = {r["mode"]: r for r in result["rows"] if (r["preset"], r["image"], r["requests"]) == (preset, image, n)}
        parts = []
        for t in MODES:
            e, g = by[mode_name(t, "eager")], by[mode_name(t, "graphed")]
            check = composition_check(e, g)
            parts.append(f"text {t}: {e['e2e_ms']:8.1f} → {g['e2e_ms']:8.1f} ms, cut {100 * g['e2e_cut']:5.1f}% "
                         f"({g['e2e_source']}" + (f"; composed {100 * check['cut']:.1f}%, "
                                                  f"{100 * check['cut_error']:+.1f} points)" if check else ")"))
        lines.append(f"{image:>6} ×{n}  " + "  |  ".join(parts))
    return "\n".join(lines) or f"no whole-request rows of {preset}"
