"""``python -m lfm2vl_lab engine``'s measurement: the peers of :mod:`.engine_peers` on one preset,
timed in turns, optionally profiled, then judged against the targets and printed from the file.

Why a file of its own: the peers say *what* runs; this says how it is measured and read, so that the
printed table and the targets come from the result file, never from live variables.

Targets (stated once, :data:`TARGETS`): on the 450M preset the engine's prefill + first token within
1.0 ms and faster than ``compile-ro``'s in the same file; its decode within 0.35 ms per token (450M)
or 0.8 ms (1.6B); every engine's graphs captured within 3 s. A missed target stays a row with
``ok: False``.
"""

from __future__ import annotations

import time

import torch

from .engine_peers import (
    BATCH,
    ENGINE_MODES,
    MODES,
    PROMPT_SOURCE,
    TOKENS_COMPARED,
    bandwidth_floor,
    prompt_embeds,
    references,
    set_up,
    timed_calls,
)
from .floor import kernel_class
from .results import target_row
from .timing import summarize, time_paired

TARGETS = {
    "prefill_sample_ms": {"lfm2-vl-450m": 1.0},  # and below compile-ro's prefill + sample, same file
    "decode_ms_per_token": {"lfm2-vl-450m": 0.35, "lfm2-vl-1.6b": 0.8},
    "capture_s": 3.0,  # every engine graph of a preset (compile excluded: compile_s says it)
}
PROFILE_KEYS = ("kernels", "launch_calls", "graph_launches", "gpu_busy_ms", "wall_ms")


def timing_fields(t: dict, mode: str, peer, suffix: str = "") -> dict:
    """Prefill + sample and decode per token (median, p90, samples) of one mode from the paired times."""
    pre, dec, n = t[f"{mode}|prefill{suffix}"], t[f"{mode}|decode{suffix}"], peer.n
    per = [(d - p) / n for p, d in zip(pre, dec)] if peer.decode_from_prefill else [d / n for d in dec]
    a, b = summarize(pre), summarize(per)
    return {"prefill_sample_ms": a["median_ms"], "prefill_sample_p90_ms": a["p90_ms"], "prefill_sample_samples_ms": pre,
            "decode_ms_per_token": b["median_ms"], "decode_p90_ms_per_token": b["p90_ms"], "decode_samples_ms": per,
            "decode_timing": "difference" if peer.decode_from_prefill else "direct"}


def batch_row(t: dict, preset: str, mode: str, peer) -> dict:
    """An engine's decode of :data:`~.engine_peers.BATCH` requests: ms per step (a token for each), tokens/s."""
    f = timing_fields(t, mode, peer, f" x{BATCH}")
    step, p90 = f.pop("decode_ms_per_token"), f.pop("decode_p90_ms_per_token")
    return {"preset": preset, "mode": mode, "requests": BATCH, **f, "decode_ms_per_step": step,
            "decode_p90_ms_per_step": p90, "tokens_per_s": BATCH * 1e3 / step if step > 0 else None}


def profile_one(fn, device) -> dict:
    """One profiled call: kernels, launches, GPU-busy and wall time, and kernels per class."""
    from .profiling import profile_callable

    rep = profile_callable(fn, warmup=1, iters=1, device=device).as_dict(gaps=False)
    out = {k: rep.get(k) for k in PROFILE_KEYS}
    classes: dict[str, int] = {}
    for _start, _dur, name in (rep.get("timeline") or {}).get("gpu", []):
        classes[kernel_class(name)] = classes.get(kernel_class(name), 0) + 1
    out["classes"] = dict(sorted(classes.items(), key=lambda kv: -kv[1]))
    return out


def profile_peer(peer, device) -> dict:
    """One profiled prefill (to the first token) and one decode step. Where a mode decodes only after
    its prefill (``generate``, the engines) the step is a 2-token call less the 1-token call."""
    pre, step = profile_one(peer.call(0), device), profile_one(peer.call(1), device)
    if peer.decode_from_prefill:
        classes = {k: step["classes"].get(k, 0) - pre["classes"].get(k, 0) for k in {*step["classes"], *pre["classes"]}}
        step = {k: (step[k] - pre[k]) if isinstance(step[k], (int, float)) and isinstance(pre[k], (int, float))
                else None for k in PROFILE_KEYS} | {"classes": {k: v for k, v in classes.items() if v}}
    step["method"] = "2-token call less 1-token call" if peer.decode_from_prefill else "one step"
    return {"prefill": pre, "decode_step": step}


def measure_preset(model, modes=MODES, repeats: int = 30, decode_tokens: int = 16, profile: bool = False,
                   say=None) -> dict:
    """Every mode on one model: set up (first calls), judged, timed in turns, optionally profiled.
    Returns ``{"setup", "rows", "profile"}`` (see the module and :mod:`.engine_peers`)."""
    name, device = model.lab_preset.name, model.device
    with torch.no_grad():
        embeds = prompt_embeds(model)
        setup = {"preset": name, "prompt_len": int(embeds.shape[1]), "prompt": PROMPT_SOURCE,
                 "floor": bandwidth_floor(model)}
        ref = references(model, embeds)
        setup.update(generate_tokens=ref.get("tokens"), reference_error=ref.get("error"))
        peers, rows = {}, {}
        # the fused engine first: should its setup lay the weights out anew, every mode runs on that layout
        for mode in sorted(modes, key=lambda m: m != "engine-fused"):
            t0 = time.perf_counter()
            peer, rows[mode] = set_up(mode, model, embeds, decode_tokens, ref)
            if peer is not None:
                peers[mode] = peer
            if say:
                say(f"{name} {mode}: " + (f"set up in {time.perf_counter() - t0:.1f} s" if peer else
                                          f"FAILED: {rows[mode]['error']}"))
        calls = {f"{m}|{k}": fn for m, p in peers.items() for k, fn in timed_calls(p).items()}
        t = time_paired(calls, repeats, 1, device) if calls else {}
        out = []
        for mode in modes:
            row = rows[mode]
            if mode in peers:
                row.update(repeats=repeats, timing="paired", decode_tokens=decode_tokens,
                           **timing_fields(t, mode, peers[mode]))
                stats = getattr(getattr(peers[mode], "eng", None), "stats", None)
                if mode in ENGINE_MODES and stats is not None:
                    row["engine_stats"] = {"replays": stats.replays, "eager": stats.eager,
                                           "recaptures": stats.recaptures}
            out.append(row)
        out += [batch_row(t, name, m, peers[m]) for m in modes if m in ENGINE_MODES and m in peers]
        prof = {m: profile_peer(peers[m], device) for m in modes if m in peers} if profile else None
    return {"setup": setup, "rows": out, "profile": prof}


def _engine_targets(r: dict, compile_ro: dict | None) -> list[dict]:
    preset, what = r["preset"], f"{r['preset']} {r['mode']}"
    if "error" in r:
        return [target_row(f"{what} runs", False, True, False, r["error"])]
    out = []
    lim = TARGETS["prefill_sample_ms"].get(preset)
    if lim is not None:
        v = r["prefill_sample_ms"]
        out.append(target_row(f"prefill+sample ms, {what}", v, lim, v <= lim))
        base = None if compile_ro is None else compile_ro.get("prefill_sample_ms")
        out.append(target_row(f"prefill+sample below compile-ro's, {what}", v, base, base is not None and v < base,
                              "" if base is not None else "no compile-ro prefill in this file"))
    lim = TARGETS["decode_ms_per_token"].get(preset)
    if lim is not None:
        v = r["decode_ms_per_token"]
        out.append(target_row(f"decode ms per token, {what}", v, lim, v <= lim))
    cap, lim = r["first_call"].get("capture_s"), TARGETS["capture_s"]
    out.append(target_row(f"capture s of every graph, {what}", cap, lim, cap is not None and cap <= lim,
                          compile_note(r["first_call"]) if cap is not None else "no graphs captured (no CUDA)"))
    return out


def compile_note(first_call: dict) -> str:
    """What a capture time leaves out: the first compile before it (the fused engine's inductor compile),
    shown beside the capture so that a short capture never hides a long start-up; empty without one."""
    c = first_call.get("compile_s")
    return f"after a {c:.1f} s first compile" if c else ""


def judge_engine(rows: list[dict]) -> list[dict]:
    """The :data:`TARGETS` judged from a file's rows (one request), per preset and engine mode."""
    one = {(r["preset"], r["mode"]): r for r in rows if r.get("requests") == 1}
    return [t for (preset, mode), r in one.items() if mode in ENGINE_MODES
            for t in _engine_targets(r, one.get((preset, "compile-ro")))]


def _ms(v, p90=None) -> str:
    return "-" if v is None else f"{v:.3f}" + (f" (p90 {p90:.3f})" if p90 is not None else "")


def _first_call(f: dict) -> str:
    split = [f"{k.removesuffix('_s')} {f[k]:.2f}" for k in ("compile_s", "capture_s") if f.get(k) is not None]
    return f"{f['first_call_s']:.2f}" + (f" ({', '.join(split)})" if split else "")


def summary_lines(result: dict) -> list[str]:
    """The printed summary, read from a result file: per preset its prompt and floor, a line per mode
    (a mode that failed says so, with its error), the engines' batched decode and the profile."""
    lines = []
    for s in result.get("setup", []):
        p, fl = s["preset"], s["floor"]
        lines.append(f"{p}: prompt {s['prompt_len']} positions; bandwidth floor {fl['floor_ms']:.4f} ms per decode "
                     f"step ({fl['param_bytes']} B / {fl['bandwidth_B_per_s']:.3g} B/s)")
        lines.append(f"  {'mode':<18} {'prefill+sample ms':<22} {'decode ms/token':<22} {'first call s':<28} "
                     f"{'token':>6} {'match':>6}  rel err vs fp32")
        for r in result["rows"]:
            if r["preset"] != p:
                continue
            if "error" in r:
                lines.append(f"  {r['mode']:<18} not run: {r['error']}")
            elif r["requests"] == 1:
                ok = "ok" if r["logits_ok"] else "FAILED"
                match = "-" if r["matching_tokens"] is None else f"{r['matching_tokens']}/{TOKENS_COMPARED}"
                lines.append(f"  {r['mode']:<18} {_ms(r['prefill_sample_ms'], r['prefill_sample_p90_ms']):<22} "
                             f"{_ms(r['decode_ms_per_token'], r['decode_p90_ms_per_token']):<22} "
                             f"{_first_call(r['first_call']):<28} {r['first_token']:>6} {match:>6}  "
                             f"{r['rel_err_vs_fp32']:.1e} {ok}")
                if r["first_call"].get("note"):
                    lines.append(f"  {'':<18} note: {r['first_call']['note']}")
            else:
                rate = "-" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:.0f}"
                lines.append(f"  {r['mode']:<18} x{r['requests']} decode {_ms(r['decode_ms_per_step'])} ms per step, "
                             f"{rate} tokens/s")
        for mode, pr in ((result.get("profile") or {}).get(p) or {}).items():
            pre, step = pr["prefill"], pr["decode_step"]
            lines.append(f"  profile {mode:<18} prefill {pre['kernels']:.0f} kernels, decode step "
                         f"{step['kernels']:.0f} kernels {step['classes'] or ''}")
    return lines
