"""The parts about the request past the encoder: the ``ttft`` grid, TTFT inside ``generate`` (``e2e``), the
text model's peers (``engine``) and whole requests (``request-3b``), measured or composed, each row saying which."""

from __future__ import annotations

import pandas as pd

from ..measure.e2e import DECODE_DRIFT_WARN
from ..measure.request import NEW_TOKENS, composed_e2e, composition_check, like_for_like
from ..measure.ttft import mode_name
from .frames import Refs, md, ms, need, needs, pct, preset_label, span, table, times, verdict
from .plots_ttft import CASE, TTFT_MODES, TTFT_PHASES, per_case, ttft_cases, ttft_frame
from .ttft_summary import decode_ratios, drift_beyond, drift_fails, text_graph_cuts

BOTH_EAGER, BOTH_GRAPHED = mode_name("eager", "eager"), mode_name("graphed", "graphed")
ONE_REQUEST = "image == '1x512' and requests == 1"  # the grid's case the pages show first


def mode_label(mode: str) -> str:
    """``text-graphed+encoder-eager`` → ``text graphed, encoder eager`` (both graphed in bold)."""
    if mode == BOTH_GRAPHED:
        return "**both graphed**"
    text, enc = mode.removeprefix("text-").split("+encoder-")
    return f"text {text}, encoder {enc}"


def _part(refs: Refs, *pieces: str, roles=("ttft",)) -> str:
    """A page's part: its tables and notes, then the line naming the files they read."""
    return "\n\n".join([*pieces, refs.source(*roles)])


def _cut(cut, drift) -> str | None:
    """The encoder graphs' cut, and its decode drift where that fails the decode control."""
    return pct(cut) and pct(cut) + (f" (drift {pct(drift, 0, sign=True)})" if drift_beyond(drift) else "")


def _arrow(a: pd.Series, b: pd.Series) -> pd.Series:
    return (a.map(ms, na_action="ignore") + " → " + b.map(ms, na_action="ignore")).astype(object)


def ttft_modes_block(refs: Refs) -> str:
    """One 512 px request per preset: TTFT in the four modes, decode per token both eager → both graphed."""
    res = refs("ttft")
    one = ttft_frame(res["rows"]).query(ONE_REQUEST)
    ttft, dec = per_case(one, "ttft_ms"), per_case(one, "decode_ms_per_token")
    out = pd.DataFrame({"preset": [preset_label(p) for p, *_ in ttft.index]})
    out[[mode_label(m) for m in TTFT_MODES]] = ttft.map(ms).assign(
        **{BOTH_GRAPHED: "**" + ttft[BOTH_GRAPHED].map(ms, na_action="ignore") + "**"}).values
    out["decode ms/token, both eager → both graphed"] = _arrow(dec[BOTH_EAGER], dec[BOTH_GRAPHED]).values
    parity = [m for p in res.get("parity") or [] for m in p["modes"].values()]
    note = (f"TTFT ms, median of {res['rows'][0].get('repeats')} paired rounds. Parity: "
            f"{sum(m['ok'] for m in parity)} of {len(parity)} mode × case checks pass.")
    return _part(refs, md(out), note)


def ttft_phases_block(refs: Refs) -> str:
    """The phases of one 512 px request, every mode of every preset."""
    df = ttft_frame(refs("ttft")["rows"])
    order = {"preset": list(dict.fromkeys(df.preset)), "mode": list(TTFT_MODES)}  # presets as recorded
    one = df.query(ONE_REQUEST).sort_values(["preset", "mode"], key=lambda col: col.map(order[col.name].index))
    out = pd.DataFrame({"preset": one.preset.map(preset_label), "mode": one["mode"].map(mode_label),
                        "TTFT": "**" + one.ttft_ms.map(ms) + "**"})
    for p in TTFT_PHASES:
        out[p] = need(one, f"phases_ms.{p}")[f"phases_ms.{p}"].map(ms)
    out["decode ms/token"] = one.decode_ms_per_token.map(ms)
    return _part(refs, md(out))


def _profiled(where: list, r: dict, busy: float | None, *graphs: str) -> list:
    """A profiled call's row of cells: ``where`` (preset, mode, ...), its kernels, launch calls (and
    ``graphs``, its graph launches), GPU-busy and wall ms, then ``busy``, the busy share."""
    return [*where, f"{r['kernels']:.0f}", f"{r['launch_calls']:.0f}", *graphs, ms(r["gpu_busy_ms"]),
            ms(r["wall_ms"]), pct(busy, 0)]


def ttft_profile_block(refs: Refs) -> str:
    """One profiled request per preset and mode: kernels, launch calls, graph launches, busy share."""
    res = refs("ttft")
    rows = [_profiled([preset_label(p["preset"]), mode_label(m)], r, r.get("busy_share"), f"{r['graph_launches']:.0f}")
            for p in res.get("profile") or [] for m in TTFT_MODES if (r := p.get(m))]
    head = ["preset", "mode", "kernels", "launch calls", "graph launches", "GPU-busy ms", "wall ms", "busy"]
    return _part(refs, f"The mean of {(res.get('profile') or [{}])[0].get('iters')} profiled calls.", table(head, rows))


def ttft_grid_block(refs: Refs) -> str:
    """Every case of the grid: TTFT all eager and both graphed, the encoder graphs' paired cut at each
    text mode (decode drift past the warning line marked), decode per token."""
    df = ttft_frame(refs("ttft")["rows"])
    ttft, dec = per_case(df, "ttft_ms"), per_case(df, "decode_ms_per_token")
    cut, drift = per_case(df, "encoder_graph_cut"), per_case(df, "decode_drift")
    out = ttft.index.to_frame(index=False).assign(preset=lambda d: d.preset.map(preset_label))  # the CASE columns
    out["TTFT all eager"], out["TTFT both graphed"] = ttft[BOTH_EAGER].map(ms).values, ttft[BOTH_GRAPHED].map(ms).values
    for m, text in ((mode_name("eager", "graphed"), "eager"), (BOTH_GRAPHED, "graphed")):
        out[f"encoder graphs' cut, text {text}"] = [_cut(c, d) for c, d in zip(cut[m], drift[m])]
    out["decode ms/token, all eager → both graphed"] = _arrow(dec[BOTH_EAGER], dec[BOTH_GRAPHED]).values
    note = f"drift: decode moved by more than {pct(DECODE_DRIFT_WARN, 0)} between the two encoder modes."
    return _part(refs, md(out), note)


def decode_ratio_block(refs: Refs) -> str:
    """Decode per token all eager / both graphed over the grid's cases whose decode control holds, with
    the cases at either end; the cases it fails in are left out and shown the same way."""
    dec = decode_ratios(refs("ttft")["rows"], BOTH_EAGER, BOTH_GRAPHED)
    kept, off = dec[~dec.disturbed], dec[dec.disturbed]

    def where(c):
        return f"{preset_label(c[0])} {c[1]} ×{c[2]}"
    if kept.empty:
        return f"No case of the grid passes the decode control ({len(off)} fail it)."
    lo, hi = kept.ratio.idxmin(), kept.ratio.idxmax()
    out = (f"Decode per token is {times(kept.ratio[lo])} ({where(lo)}) to {times(kept.ratio[hi])} ({where(hi)}) "
           f"faster with both graphed than all eager, over the {len(kept)} cases whose decode control holds: "
           f"{span(kept.graphed_ms)} ms per token graphed against {span(kept.eager_ms)} ms eager.")
    if len(off):  # what the decode control leaves out, shown as the kept cases are
        out += (f" Left out, their decode control failing: {len(off)} case{'s' * (len(off) > 1)} of "
                f"{span(off.ratio, times)} (" + ", ".join(map(where, off.index)) + ").")
    return out


def text_cuts_block(refs: Refs) -> str:
    """What graphing the text model cuts from TTFT (encoder graphed), by the batch's prompt tokens."""
    rows = refs("ttft")["rows"]
    out = [[preset_label(p), c["image"], c["requests"], c["prompt_tokens"], ms(c["eager_ms"]), ms(c["graphed_ms"]),
            pct(c["cut"])] for p in dict.fromkeys(c[0] for c in ttft_cases(rows)) for c in text_graph_cuts(rows, p)]
    head = ["preset", "image", "requests", "prompt tokens", "TTFT, text eager", "TTFT, text graphed", "cut (paired)"]
    return _part(refs, table(head, out))


def engine_setup_block(refs: Refs) -> str:
    """What the text engine captured per preset, and whether any timed call fell back to eager."""
    rows = [[preset_label(s["preset"]), "fused" if s.get("engine_fused") else "unfused",
             ms(s["engine_capture"].get("compile_s")) if s.get("engine_fused") else None,
             len(s["engine_capture"]["captured"]), ms(s["engine_capture"]["capture_s"]),
             f"{s['engine_capture']['cache_mib']:.0f}",
             sum(((s.get("engine_stats") or {}).get("eager") or {}).values())]
            for s in refs("ttft").get("setup") or []]
    return table(["text engine", "layers", "first compile s", "graphs", "capture s", "cache MiB",
                  "eager fallbacks when timed"], rows)


def e2e_block(refs: Refs) -> str:
    """TTFT inside ``generate``: transformers' image path against the graphed encoder installed."""
    df = refs.frame("e2e", "decode_drift")
    hf, g = (df[df["mode"] == m].drop_duplicates(CASE, keep="last").set_index(CASE) for m in ("hf-eager", "lab-graph"))
    d = g.join(hf, how="inner", suffixes=("", "_hf")).reset_index()
    out = pd.DataFrame({"preset": d.preset.map(preset_label), "image": d.image, "requests": d.requests,
                        "TTFT transformers": d.ttft_ms_hf.map(ms), "TTFT graphed encoder": d.ttft_ms.map(ms),
                        "change (medians)": (-d.ttft_reduction).map(lambda v: pct(v, sign=True)),
                        "change (paired)": (-d.ttft_reduction_paired).map(lambda v: pct(v, sign=True)),
                        "encoder ms": d.encoder_ms_hf.map(ms) + " → " + d.encoder_ms.map(ms),
                        "decode drift": [pct(v, 0, True) + " (disturbed)" * drift_beyond(v) for v in d.decode_drift]})
    note = (f"Median ms of {df.repeats.iloc[0]} rounds. disturbed: decode per token moved by more than "
            f"{pct(DECODE_DRIFT_WARN, 0)} between the modes.")
    return _part(refs, md(out), note, roles=("e2e",))


def e2e_profile_block(refs: Refs) -> str:
    """One profiled TTFT call inside ``generate``, split into the encoder and the text model."""
    rows = [_profiled([preset_label(p["preset"]), mode, part], r, r["gpu_busy_ms"] / r["wall_ms"])
            for p in refs("e2e").get("ttft_profile") or [] for mode in ("hf-eager", "lab-graph")
            for part in ("encoder", "text") if (r := (p.get(mode) or {}).get(part))]
    head = ["preset", "mode", "part", "kernels", "launch calls", "GPU-busy ms", "wall ms", "busy"]
    return _part(refs, table(head, rows), roles=("e2e",))


def image_path_pairs(refs: Refs, kind: str, side: str):
    """The ``ttft`` file's image-path records of ``kind``, each with the record of ``side`` for the
    same preset and workload (``{}`` where it has none)."""
    ip = refs("ttft").get("image_path") or []
    by_case = {(r.get("preset"), r["workload"]): r for r in ip if r["kind"] == side}
    return [(r, by_case.get((r.get("preset"), r["workload"]), {})) for r in ip if r["kind"] == kind]


def image_path_block(refs: Refs) -> str:
    """``encode()`` fed the processor's CPU output against GPU-resident input, and the staging split."""
    rows = [[preset_label(r.get("preset", "?")), r["workload"], ms(r["gpu_ms_median"]), ms(r["cpu_ms_median"]),
             times(r["ratio"], 2), times(r.get("ratio_padded"), 2), times(r.get("ratio_chunked"), 2),
             ms(s.get("gather_ms_median"), 3), ms(s.get("upload_ms_median"), 3), ms(s.get("upload_gb_s"), 1),
             verdict(r.get("outputs_equal")), (r.get("staging") or {}).get("host_waits")]
            for r, s in image_path_pairs(refs, "encode_sources", "staging_split")]
    head = ["preset", "workload", "from GPU input ms", "from CPU output ms", "ratio", "ratio, padded float32",
            "ratio, chunked upload", "host gather ms", "upload ms", "upload GB/s", "outputs equal", "host waits"]
    return _part(refs, table(head, rows))


def processor_block(refs: Refs) -> str:
    """The image processor on the CPU against the same on the GPU (``device="cuda"``)."""
    rows = [[preset_label(r.get("preset", "?")), r["workload"], ms(r["cpu_ms_median"]), ms(r["device_ms_median"]),
             times(r["speedup"], 2), ms(p.get("max_diff_levels"), 0)]
            for r, p in image_path_pairs(refs, "processor_time", "processor_parity")]
    head = ["preset", "workload", "CPU processor ms", "GPU processor ms", "CPU / GPU",
            "largest difference (uint8 levels)"]
    return _part(refs, table(head, rows))


def ttft_parity_block(refs: Refs) -> str:
    """Every mode's tokens against ``generate`` and first-token logits against float32, per parity case."""
    rows = []
    for p in refs("ttft").get("parity") or []:
        margin = min(p.get("fp32_top2_margin") or [float("nan")])
        for m, r in p["modes"].items():
            rows.append([preset_label(p["preset"]), f"{p['image']} ×{p['requests']}", f"{margin:.3g}", mode_label(m),
                         f"{r['rel_err_vs_fp32']:.2e} ({r['hf_rel_err_vs_fp32']:.2e})",
                         verdict(r["same_first_token"]), verdict(r["first_token_as_fp32"]),
                         f"{r['matching_tokens']} of {p['new_tokens']}", verdict(r["ok"])])
    head = ["preset", "case", "float32 top-2 margin", "mode", "logits vs float32 (transformers' bf16)",
            "first token as `generate`", "first token as float32", "tokens as `generate`", "passes"]
    return _part(refs, table(head, rows))


PEER_LABELS = {"generate": "transformers' `generate`", "hf-static-compile": "`generate`, static cache + compile",
               "compile-ro": "`torch.compile(mode=\"reduce-overhead\")`", "engine": "`TextEngine`",
               "engine-fused": "`TextEngine(fuse=True)`"}


def engine_peers_block(refs: Refs) -> str:
    """The text model's peers on one prompt: prefill + sample, decode per token, the first call's
    cost, the kernels of one decode step, tokens against ``generate``'s."""
    res = refs("engine")
    rows = []
    for r in res["rows"]:
        if r["requests"] != 1:
            continue
        label = PEER_LABELS.get(r["mode"], r["mode"])
        if "error" in r:
            rows.append([preset_label(r["preset"]), label] + ["–"] * 5 + [f"not run: {r['error'][:80]}"])
            continue
        first = r["first_call"]
        cost = (f"{first['compile_s']:.1f} s compile + {first['capture_s']:.2f} s capture" if first.get("capture_s")
                is not None else f"{first['first_call_s']:.1f} s")
        step = ((res.get("profile") or {}).get(r["preset"]) or {}).get(r["mode"], {}).get("decode_step") or {}
        rows.append([preset_label(r["preset"]), label, ms(r["prefill_sample_ms"]), ms(r["decode_ms_per_token"], 3),
                     cost, f"{step['kernels']:.0f}" if step else "–", f"{r['matching_tokens']} of 16",
                     f"{r['rel_err_vs_fp32']:.1e}"])
    head = ["preset", "mode", "prefill + sample ms", "decode ms/token", "first call", "kernels per decode step",
            "tokens as `generate`", "logits vs float32"]
    floors = "; ".join(f"{preset_label(s['preset'])} {f['floor_ms']:.3f} ms ({f['param_bytes'] / 1e9:.3f} GB at "
                       f"{f['bandwidth_B_per_s'] / 1e12:.1f} TB/s)" for s in res["setup"] for f in [s["floor"]])
    eight = [f"{PEER_LABELS.get(r['mode'], r['mode'])} {ms(r['decode_ms_per_step'])} ms per step" for r in res["rows"]
             if r["requests"] > 1 and "error" not in r]
    note = (f"One request ({res['setup'][0]['prompt_len']} positions), median ms of {res['rows'][0].get('repeats')} "
            f"rounds. The weights' floor per decode step: {floors}. Eight requests: {', '.join(eight)}.")
    return _part(refs, table(head, rows), note, roles=("engine",))


REQUEST_ROLE = "request-3b"
REQUESTS = (1, 2, 4)  # the low batch sizes the PR's claim is about


# the parts below are drawn from the request file
request_part = needs(REQUEST_ROLE, f"_Not in this reference set: `python -m lfm2vl_lab record` records role "
                     f"`{REQUEST_ROLE}` (`record --dry-run` shows its command)._")


def _tokens(refs: Refs) -> int:
    return next((r["e2e_tokens"] for r in refs(REQUEST_ROLE)["rows"] if "e2e_tokens" in r), NEW_TOKENS)


def e2e_cells(refs: Refs) -> dict[tuple, dict]:
    """Per (preset, image, requests), its rows by mode: e2e ms, its source, and the encoder graphs' cuts."""
    tokens, cells = _tokens(refs), {}
    for r in refs("ttft")["rows"]:
        if r["requests"] in REQUESTS:
            cells.setdefault((r["preset"], r["image"], r["requests"]), {})[r["mode"]] = dict(
                r, e2e_ms=composed_e2e(r, tokens), e2e_source="composed")
    for r in (r for m in cells.values() for r in m.values() if r["encoder_mode"] == "graphed"):
        eager = cells[r["preset"], r["image"], r["requests"]][mode_name(r["text_mode"], "eager")]
        r["e2e_cut"] = 1 - r["e2e_ms"] / eager["e2e_ms"]
    for r in refs(REQUEST_ROLE)["rows"]:  # the measured whole requests replace the composed ones
        if "e2e_ms" in r and r["requests"] in REQUESTS:
            cells.setdefault((r["preset"], r["image"], r["requests"]), {})[r["mode"]] = r
    return cells


def _check_cell(check: dict | None) -> str | None:
    """A measured row's composition beside it: composed ms eager → graphed, the cut it gives, its error."""
    return check and (f"{ms(check['composed_ms'][0], 1)} → {ms(check['composed_ms'][1], 1)}, {pct(check['cut'])} "
                      f"({100 * check['cut_error']:+.1f} points)")


@request_part
def e2e_requests_block(refs: Refs, res: dict) -> str:
    """Whole requests at 1, 2 and 4 requests, encoder eager → graphed, text graphed and eager; a measured
    row also shows what the composition from parts makes of it, so the composed rows carry a known error."""
    tokens = _tokens(refs)
    out, checks = [], []
    for (preset, image, n), m in e2e_cells(refs).items():
        row = [preset_label(preset), image, n]
        for t in ("graphed", "eager"):
            e, g = m.get(mode_name(t, "eager")), m.get(mode_name(t, "graphed"))
            cut = pct(g and g.get("e2e_cut"))
            if cut and drift_fails(g):
                cut += " (drift)"  # the decode control failed: the two decodes differ by more than the saving
            row += [f"{ms(e and e['e2e_ms'], 1)} → {ms(g and g['e2e_ms'], 1)}", cut]
            if t == "graphed":
                check = composition_check(e, g) if e and g else None
                checks += [check] if check else []
                row += ["measured" if (g or {}).get("e2e_source") == "measured" else "composed", _check_cell(check)]
        out.append(row)
    head = ["preset", "image", "requests", "text graphed: ms, encoder eager → graphed", "cut",
            "text graphed: measured or composed",
            "text graphed, composed from the measured rows' parts: ms, cut (error)",
            "text eager (composed): ms, encoder eager → graphed", "cut"]
    ms_gap = max((abs(x) for c in checks for x in c["ms_error"]), default=None)
    cut_gap = max((abs(c["cut_error"]) for c in checks), default=None)
    check_note = (f"On the {len(checks)} measured rows the composition lands within {pct(ms_gap)} of each measured "
                  f"whole request, its cut off by up to {100 * cut_gap:.1f} points." if checks else
                  "No row was measured, so the composition's error is not known here.")
    note = (f"Whole requests of {tokens} output tokens, medians. {check_note} (drift): the two encoder modes decoded "
            f"more than {pct(DECODE_DRIFT_WARN, 0)} apart.")
    return _part(refs, table(head, out), note, roles=(REQUEST_ROLE, "ttft"))


@request_part
def throughput_block(refs: Refs, res: dict) -> str:
    """The offline-throughput run: requests and tokens per second, encoder eager and graphed."""
    out = [[preset_label(tp["preset"]), m.split("+")[1].replace("encoder-", "encoder "), f"{r['requests_per_s']:.2f}",
            f"{r['tokens_per_s']:.0f}", ms(r["pass_s"], 2)] for tp in res.get("throughput", [])
           for m, r in tp["modes"].items()]
    if not out:
        return "_This request file has no throughput run._"
    tp = res["throughput"][0]
    note = (f"{tp['requests']} requests, batches of up to {tp['batch']}, {tp['new_tokens']} output tokens each; median "
            f"of {tp['passes']} passes in turns. Encoder graphs: {times(tp['speedup'], 3)} the throughput.")
    return _part(refs, table(["preset", "encoder", "requests/s", "output tokens/s", "s per pass"], out), note,
                 roles=(REQUEST_ROLE,))


@request_part
def like_for_like_block(refs: Refs, res: dict) -> str:
    """The PR's claim, like for like: one sentence from the request file."""
    return _part(refs, like_for_like(res), roles=(REQUEST_ROLE,))


BLOCKS = {"e2e-requests": e2e_requests_block, "throughput": throughput_block, "like-for-like": like_for_like_block,
          "engine-peers": engine_peers_block, "ttft-modes": ttft_modes_block, "ttft-phases": ttft_phases_block,
          "ttft-profile": ttft_profile_block, "ttft-grid": ttft_grid_block, "ttft-decode": decode_ratio_block,
          "ttft-text-cuts": text_cuts_block, "ttft-engine": engine_setup_block, "ttft-parity": ttft_parity_block,
          "image-path": image_path_block, "processor": processor_block, "e2e": e2e_block,
          "e2e-profile": e2e_profile_block}
