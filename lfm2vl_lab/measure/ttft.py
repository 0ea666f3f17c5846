"""TTFT the way a serving engine sees it: the four modes of :mod:`~lfm2vl_lab.serving.pipeline` (text
model eager or graphed × encoder eager or graphed), timed in alternating turns, each request broken
into its phases (processor, host-to-device, encoder, merge, prefill, first-token sampling) and its
decode steps.

Why four modes: vLLM PR #44930's "10-20% lower end-to-end latency" was measured inside an engine
whose text model already runs under CUDA graphs. Inside ``generate`` (``measure/e2e.py``) the text
model runs eagerly and its launch gaps dilute the encoder's saving. The grid separates the two.

Timing: one call is one request batch from its images (the processor runs in every call) to the
first token on the host. CUDA events mark the phases on the stream, so the phases add up to the call
with no extra syncs; ``ttft_ms`` leaves the processor out (it runs on the CPU, the same in every
mode), ``request_ms`` keeps it. Decode is timed in calls of its own (``1 + decode_tokens`` tokens),
and its per-token time is the decode-drift control: it never runs the encoder, so at one text mode
the two encoder modes should decode alike (``e2e.DECODE_DRIFT_WARN``).
"""

from __future__ import annotations

import statistics
import time

import torch

from ..core.packing import tokens_for
from ..model.inputs import process_images
from ..model.parity import lowp_parity
from ..serving.cache import bucket_len
from ..serving.engine import TextEngine
from ..serving.pipeline import MODES, VlmPipeline
from .e2e import DECODE_DRIFT_WARN, IMAGES, PROMPT_TEXT_TOKENS, build_prompt, grid_rows, paired_reduction
from .results import target_row as _row  # one judged target, as every judge writes it
from .timing import time_paired
from .workloads import synthetic_image

DECODE_TOKENS = 16
PARITY_CASES = (("1x512", 2), ("tiled", 1))  # (image, requests): two requests in one batch, and tiles
CPU_INPUT_WORKLOADS = ("1x512", "4x512")  # where the CPU-input encode() target is judged
# The TTFT targets, stated once (450M, bf16, one 512 px request, paired timing).
TARGETS = {
    "encoder_graph_cut_text_graphed": 0.35,  # TTFT cut by encoder graphs with the text model graphed
    "both_graphed_ttft_ms": 2.2,  # encoder + merge + prefill + first token, processor excluded
    # ms per decode token, both graphed, one 512 px request (the text model's bandwidth floor: about
    # 0.15 ms for 450M, 0.5 ms for 1.6B; the ``engine`` file computes it)
    "decode_ms_per_token": {"lfm2-vl-450m": 0.35, "lfm2-vl-1.6b": 0.8},
    "encoder_graph_cut_text_eager": 0.15,
    "cpu_input_encode_ratio": 1.05,  # encode() from the processor's CPU output / from GPU-resident input
}


def mode_name(text_mode: str, encoder_mode: str) -> str:
    return f"text-{text_mode}+encoder-{encoder_mode}"


def build_pipelines(model, genc, engine) -> dict[str, VlmPipeline]:
    """The grid: one pipeline per (text mode, encoder mode), the graphed ones sharing ``genc``/``engine``."""
    return {mode_name(t, e): VlmPipeline(model, e, t, genc=genc, engine=engine) for t in MODES for e in MODES}


class PhaseClock:
    """``mark(phase)`` as the pipeline's hook: a CUDA event per phase on CUDA (read after the call's
    own sync), ``perf_counter`` elsewhere (CPU work is synchronous)."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"
        self.marks: list[tuple[str, object]] = []

    def _now(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def start(self) -> None:
        self.marks = [("start", self._now())]

    def mark(self, phase: str) -> None:
        self.marks.append((phase, self._now()))

    def phases(self) -> dict[str, float]:
        """ms per phase, in order."""
        out = {}
        for (_, a), (name, b) in zip(self.marks, self.marks[1:]):
            out[name] = a.elapsed_time(b) if self.cuda else (b - a) * 1e3
        return out


def request_call(pipe: VlmPipeline, images: list, input_ids, new_tokens: int, clock: PhaseClock, log: list):
    """One call of one mode: processor, then the pipeline, then the tokens on the host. Appends
    ``(phases_ms, tokens)`` to ``log``."""
    model = pipe.model

    def call():
        clock.start()
        inputs = process_images(images, model)
        clock.mark("processor")
        tokens = pipe.run(input_ids, inputs, new_tokens, mark=clock.mark).cpu()
        log.append((clock.phases(), tokens))
        return tokens

    return call


def prompt_for(model, image: str, n: int):
    """``n`` requests of one image each: the images, and the prompt ids (host) that match them."""
    img = synthetic_image(*IMAGES[image], seed=1)
    inputs = process_images([img], model)
    ids = build_prompt(model, inputs, n)["input_ids"].cpu()
    return [img] * n, ids


def prompt_len(model, image: str) -> int:
    """The prompt length of one request of ``image`` (text tokens plus its image tokens)."""
    inputs = process_images([synthetic_image(*IMAGES[image], seed=1)], model)
    f = model.config.downsample_factor
    return PROMPT_TEXT_TOKENS + sum(tokens_for(s, f) for s in inputs["spatial_shapes"].tolist())


def capture_engine(engine: TextEngine, model, images, requests, progress: bool = True) -> dict:
    """Capture the text engine's graphs for every (requests, image) of the grid and of the parity
    cases (:data:`PARITY_CASES`), timed: ``capture_s`` the capture alone, ``compile_s`` a fused
    engine's first compile, ``wall_s`` the whole call."""
    cases = [(im, n) for im in images for n in requests] + list(PARITY_CASES)
    shapes = [(n, prompt_len(model, im)) for im, n in cases]
    # the parity cases only where the engine holds them (a notebook sizes its engine for its own grid)
    shapes = list(dict.fromkeys((n, length) for n, length in shapes
                                if n <= engine.max_batch and bucket_len(length, engine.len_bucket) <= engine.max_len))
    t0 = time.perf_counter()
    info = engine.capture(shapes)
    torch.cuda.synchronize()
    info["wall_s"] = time.perf_counter() - t0
    info["shapes"] = shapes
    if progress:
        compiled = f" (after {info['compile_s']:.1f} s compiling)" if info["compile_s"] else ""
        print(f"text engine: {len(info['captured'])} graphs in {info['capture_s']:.2f} s{compiled}, "
              f"cache {info['cache_mib']:.0f} MiB", flush=True)
    return info


def median_phases(log: list, repeats: int) -> dict[str, float]:
    runs = [p for p, _ in log[-repeats:]]
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def cell_rows(model, pipes: dict, image: str, n: int, repeats: int, decode_tokens: int) -> list[dict]:
    """The four rows of one image and request count: TTFT calls, then decode calls, each in turns."""
    dev = model.device
    images, ids = prompt_for(model, image, n)
    clock = PhaseClock(dev)
    logs = {m: [] for m in pipes}
    calls = {m: request_call(p, images, ids, 1, clock, logs[m]) for m, p in pipes.items()}
    ttft_total = time_paired(calls, repeats, 1, dev)
    dlogs = {m: [] for m in pipes}
    dcalls = {m: request_call(p, images, ids, 1 + decode_tokens, clock, dlogs[m]) for m, p in pipes.items()}
    time_paired(dcalls, repeats, 1, dev)
    ref_tokens = logs[mode_name("eager", "eager")][-1][1]
    rows = {}
    for m, p in pipes.items():
        proc = [ph["processor"] for ph, _ in logs[m][-repeats:]]
        ttft = [t - q for t, q in zip(ttft_total[m], proc)]
        tokens = logs[m][-1][1]
        decode = [ph["decode"] / decode_tokens for ph, _ in dlogs[m][-repeats:]]
        rows[m] = {
            "preset": model.lab_preset.name, "image": image, "requests": n, "mode": m,
            "text_mode": p.text_mode, "encoder_mode": p.encoder_mode, "prompt_len": int(ids.shape[1]),
            "prefill_len": bucket_len(int(ids.shape[1])) if p.text_mode == "graphed" else int(ids.shape[1]),
            "repeats": repeats, "timing": "paired", "ttft_ms": statistics.median(ttft), "ttft_samples_ms": ttft,
            "request_ms": statistics.median(ttft_total[m]), "phases_ms": median_phases(logs[m], repeats),
            "decode_tokens": decode_tokens, "decode_ms_per_token": statistics.median(decode),
            "first_tokens": tokens[:, 0].tolist(),
            "same_first_tokens": bool((tokens[:, 0] == ref_tokens[:, 0]).all()),
            "same_decode_tokens": bool((dlogs[m][-1][1] == dlogs[mode_name("eager", "eager")][-1][1]).all()),
        }
        ran_eager = [what for what, on in (("encoder", p.encoder_mode == "graphed" and not p.genc.captured),
                                           ("text model", p.text_mode == "graphed" and not p.text.graphs)) if on]
        if ran_eager:
            rows[m]["note"] = f"no CUDA graphs captured: the graphed {' and '.join(ran_eager)} ran eagerly"
    _add_reductions(rows)
    return list(rows.values())


def _add_reductions(rows: dict) -> None:
    """Paired TTFT cuts: the encoder graph's at each text mode, and every mode's against both eager;
    the decode drift between the two encoder modes at each text mode."""
    base = rows[mode_name("eager", "eager")]["ttft_samples_ms"]
    for t in MODES:
        eager, graphed = rows[mode_name(t, "eager")], rows[mode_name(t, "graphed")]
        graphed["encoder_graph_cut"] = paired_reduction(eager["ttft_samples_ms"], graphed["ttft_samples_ms"])
        graphed["decode_drift"] = graphed["decode_ms_per_token"] / eager["decode_ms_per_token"] - 1
    for r in rows.values():
        r["cut_vs_all_eager"] = paired_reduction(base, r["ttft_samples_ms"])


def run_ttft(model, genc, engine, images=("1x512", "tiled"), requests=(1, 2, 4, 8), repeats: int = 5,
             decode_tokens: int = DECODE_TOKENS, progress: bool = True, on_row=None) -> list[dict]:
    """The grid's rows for one model: every image × request count × the four modes (see the module)."""
    if repeats < 1 or decode_tokens < 1 or min(requests, default=0) < 1:
        raise ValueError(f"need repeats, decode_tokens and every request count >= 1; got repeats={repeats}, "
                         f"decode_tokens={decode_tokens}, requests={list(requests)}")
    pipes = build_pipelines(model, genc, engine)
    return grid_rows([(im, n) for im in images for n in requests], "ttft grid",
                     lambda im, n: cell_rows(model, pipes, im, n, repeats, decode_tokens), progress, on_row)


def ran_eagerly(row: dict) -> tuple[str, ...]:
    """The graphed sides of a row that ran without graphs ("encoder", "text model"), from its ``note``."""
    note = row.get("note", "")
    return tuple(side for side in ("encoder", "text model") if side in note)


def shown_mode(mode: str, eager_sides=()) -> str:
    """``mode`` as the terminal shows it: a graphed side in ``eager_sides`` (nothing captured: no
    CUDA) reads ``lab-eager``, the kit's code run without graphs, as ``e2e`` and ``bench`` call it.
    Result files keep the mode's own name, with a ``note``."""
    text, enc = mode.removeprefix("text-").split("+encoder-")
    text = "lab-eager" if text == "graphed" and "text model" in eager_sides else text
    enc = "lab-eager" if enc == "graphed" and "encoder" in eager_sides else enc
    return mode_name(text, enc)


def print_row(row: dict) -> None:
    """One grid row as two lines, named by what ran (:func:`shown_mode`)."""
    ph = "  ".join(f"{k} {v:.2f}" for k, v in row["phases_ms"].items())
    graphless = "encoder" in ran_eagerly(row)
    cut = "cut vs encoder-eager" if graphless else "encoder-graph cut"
    cut = f"  {cut} {100 * row['encoder_graph_cut']:.1f}%" if "encoder_graph_cut" in row else ""
    print(f"{row['preset']:>14} {row['image']:>6} x{row['requests']} {shown_mode(row['mode'], ran_eagerly(row)):>28}"
          f"  TTFT {row['ttft_ms']:7.2f} ms{cut}  decode {row['decode_ms_per_token']:.2f} ms/token"
          f"\n    phases: {ph}  same first tokens {row['same_first_tokens']}", flush=True)
    drift = row.get("decode_drift")
    if drift is not None and abs(drift) > DECODE_DRIFT_WARN:
        print(f"  warning: decode differs by {100 * drift:+.0f}% between the encoder modes; this row's TTFT cut "
              "is not the encoder alone", flush=True)


def _first_logits(pipe: VlmPipeline, ids, inputs) -> torch.Tensor:
    pipe.run(ids, inputs, 1)
    return pipe.text.logits[: ids.shape[0]].to(torch.float32, copy=True)  # the next run overwrites the buffer


@torch.no_grad()
def ttft_parity(model, pipes: dict, cases=PARITY_CASES, new_tokens: int = 8) -> list[dict]:
    """Every mode against transformers, per ``(image, requests)`` case: its greedy tokens against
    ``generate``'s (the first must be equal; ``matching_tokens`` counts the equal leading ones), and
    its first-token logits against a float32 copy of the same weights run through transformers'
    eager path, judged the way the encoder's bf16 parity is (:func:`lfm2vl_lab.model.parity.lowp_parity`:
    within 1e-2, or no worse than 1.05 × transformers' own path in the model's dtype, the
    ``text-eager+encoder-eager`` mode). ``first_token_as_fp32`` and ``fp32_top2_margin`` tell a
    token swapped by rounding (float32's top two within the bf16 error) from a wrong one."""
    import copy

    ref32 = model if model.dtype == torch.float32 else copy.deepcopy(model).float()
    ref32.lab_preset = model.lab_preset
    out = [_parity_case(model, ref32, pipes, image, n, new_tokens) for image, n in cases]
    del ref32
    return out


def _parity_case(model, ref32, pipes: dict, image: str, n: int, new_tokens: int) -> dict:
    from .e2e import generate_once

    images, ids = prompt_for(model, image, n)
    inputs = process_images(images, model)
    batch = build_prompt(model, process_images(images[:1], model), n)  # the same ids, images repeated per request
    want = generate_once(model, batch, new_tokens)[:, ids.shape[1]:].cpu()
    ref = _first_logits(VlmPipeline(ref32, "eager", "eager"), ids, inputs)
    top2 = ref.topk(2, dim=-1).values
    out = {"image": image, "requests": n, "new_tokens": new_tokens, "generate_tokens": want.tolist(),
           "fp32_first_tokens": ref.argmax(-1).tolist(),
           # how far float32's best token leads its second, per request: bf16 rounding (logits ~1e-2
           # off float32) can swap two tokens this close
           "fp32_top2_margin": (top2[:, 0] - top2[:, 1]).tolist(), "modes": {}}
    hf_logits = _first_logits(pipes[mode_name("eager", "eager")], ids, inputs)
    for m, p in pipes.items():
        logits = _first_logits(p, ids, inputs)
        toks = p.run(ids, inputs, new_tokens).cpu()
        same = (toks == want).all(0).tolist() + [False]
        judged = lowp_parity([logits], [hf_logits], [ref])
        out["modes"][m] = {"rel_err_vs_fp32": judged["rel_err"], "hf_rel_err_vs_fp32": judged["hf_rel_err"],
                           "finite": bool(torch.isfinite(logits).all()), "logits_ok": judged["pass"],
                           "same_first_token": bool((toks[:, 0] == want[:, 0]).all()),
                           "first_token_as_fp32": bool((logits.argmax(-1) == ref.argmax(-1)).all()),
                           "matching_tokens": same.index(False)}
        out["modes"][m]["ok"] = judged["pass"] and out["modes"][m]["same_first_token"]
    return out


def profile_modes(model, pipes: dict, image: str = "1x512", n: int = 1, iters: int = 3) -> dict:
    """torch.profiler over one request (processor left out) per mode: kernels, launches, GPU-busy and
    wall time, so a mode's TTFT can be read as GPU work or launch gaps."""
    from .profiling import profile_callable

    images, ids = prompt_for(model, image, n)
    inputs = process_images(images, model)
    keep = ("kernels", "launch_calls", "graph_launches", "gpu_busy_ms", "wall_ms", "gap_median_us")
    out = {"image": image, "requests": n, "iters": iters}
    for m, p in pipes.items():
        rep = profile_callable(lambda p=p: p.run(ids, inputs, 1).cpu(), warmup=1, iters=iters, device=model.device)
        d = rep.as_dict(timeline=False, gaps=False)
        out[m] = {k: d[k] for k in keep if k in d}
        out[m]["busy_share"] = d["gpu_busy_ms"] / d["wall_ms"] if d.get("wall_ms") else None
    return out


def _mismatch(row: dict, parity: list[dict]) -> str:
    """A row whose first tokens differ from eager's, with what the parity case of the same
    preset, image and requests (if recorded) says about it: float32's choice and its top-2 margin."""
    where = f"{row['preset']} {row['image']} x{row['requests']} {row['mode']}"
    for p in parity:
        if (p.get("preset"), p["image"], p["requests"]) == (row["preset"], row["image"], row["requests"]):
            m = p["modes"].get(row["mode"], {})
            return (f"{where} (its first token is float32's: {m.get('first_token_as_fp32')}; float32's top-2 "
                    f"margin {min(p.get('fp32_top2_margin') or [float('nan')]):.3g})")
    return where


def judge_ttft(rows: list[dict], image_path: list[dict] | None = None, parity: list[dict] | None = None,
               preset: str = "lfm2-vl-450m") -> list[dict]:
    """The TTFT :data:`TARGETS` judged from a grid's rows (and the image-path and parity records, if any)."""
    by = {r["mode"]: r for r in rows if r["preset"] == preset and r["image"] == "1x512" and r["requests"] == 1}
    out = []
    both, tg = by.get(mode_name("graphed", "graphed")), by.get(mode_name("eager", "graphed"))
    lim = TARGETS["encoder_graph_cut_text_graphed"]
    out.append(_row("encoder graphs' TTFT cut, text graphed", both and both["encoder_graph_cut"], lim,
                    bool(both) and both["encoder_graph_cut"] >= lim))
    lim = TARGETS["both_graphed_ttft_ms"]
    out.append(_row("TTFT ms, both graphed", both and both["ttft_ms"], lim, bool(both) and both["ttft_ms"] <= lim))
    for name, lim in TARGETS["decode_ms_per_token"].items():
        d = next((r for r in rows if (r["preset"], r["image"], r["requests"], r["mode"])
                  == (name, "1x512", 1, mode_name("graphed", "graphed"))), None)
        if d is not None:
            out.append(_row(f"decode ms per token, both graphed, {name}", d["decode_ms_per_token"], lim,
                            d["decode_ms_per_token"] <= lim))
    lim = TARGETS["encoder_graph_cut_text_eager"]
    out.append(_row("encoder graphs' TTFT cut, text eager", tg and tg["encoder_graph_cut"], lim,
                    bool(tg) and tg["encoder_graph_cut"] >= lim))
    lim = TARGETS["cpu_input_encode_ratio"]
    for r in image_path or []:
        wanted = r.get("kind") == "encode_sources" and r["workload"] in CPU_INPUT_WORKLOADS
        if wanted and r.get("preset", preset) == preset:
            out.append(_row(f"encode() CPU input / GPU input, {r['workload']}", r["ratio"], lim, r["ratio"] <= lim))
    same = [_mismatch(r, parity or []) for r in rows if not r["same_first_tokens"]]
    out.append(_row("every mode's first tokens equal eager's", not same, True, not same, "; ".join(same)))
    if parity:
        bad = [f"{p['preset']} {p['image']} x{p['requests']} {m}" for p in parity for m, r in p["modes"].items()
               if not r["ok"]]
        out.append(_row("every mode passes parity (tokens vs generate, logits vs fp32)", not bad, True, not bad,
                        ", ".join(bad)))
    return out
