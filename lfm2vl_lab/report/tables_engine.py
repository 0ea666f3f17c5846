"""The parts about the request past the encoder: the ``ttft`` grid, TTFT inside ``generate`` (``e2e``), the
text model's peers (``engine``) and whole requests (``request-3b``), measured or composed, each row saying which."""

from __future__ import annotations

import pandas as pd

from ..measure.e2e import DECODE_DRIFT_WARN
from ..measure.request import NEW_TOKENS, composed_e2e, composition_check, like_for_like
from ..measure.ttft import mode_name
from .frames import Part, ms, pct, preset_label, records, times, verdict
from .plots_ttft import CASE, TTFT_MODES, TTFT_PHASES, per_case, ttft_frame
from .ttft_summary import drift_beyond, drift_fails

BOTH_EAGER, BOTH_GRAPHED = mode_name("eager", "eager"), mode_name("graphed", "graphed")
ONE_REQUEST = "image == '1x512' and requests == 1"  # the grid's case the pages show first
def times2(v) -> str:
    return times(v, 2)


def ms3(v) -> str:
    return ms(v, 3)


DRIFT = f"decode moved by more than {pct(DECODE_DRIFT_WARN, 0)} between the two encoder modes"


def mode_label(mode: str) -> str:
    """``text-graphed+encoder-eager`` → ``text graphed, encoder eager`` (both graphed in bold)."""
    if mode == BOTH_GRAPHED:
        return "**both graphed**"
    text, enc = mode.removeprefix("text-").split("+encoder-")
    return f"text {text}, encoder {enc}"


def _arrow(a: pd.Series, b: pd.Series) -> pd.Series:
    return (a.map(ms, na_action="ignore") + " → " + b.map(ms, na_action="ignore")).astype(object)


def ttft_modes(refs) -> list:
    """One 512 px request per preset: TTFT in the four modes, decode per token both eager → both graphed."""
    res = refs("ttft")
    one = ttft_frame(res["rows"]).query(ONE_REQUEST)
    ttft, dec = per_case(one, "ttft_ms"), per_case(one, "decode_ms_per_token")
    out = pd.DataFrame({"preset": [preset_label(p) for p, *_ in ttft.index]})
    out[[mode_label(m) for m in TTFT_MODES]] = ttft.map(ms).assign(
        **{BOTH_GRAPHED: "**" + ttft[BOTH_GRAPHED].map(ms, na_action="ignore") + "**"}).values
    out["decode ms/token, both eager → both graphed"] = _arrow(dec[BOTH_EAGER], dec[BOTH_GRAPHED]).values
    parity = [m for p in res.get("parity") or [] for m in p["modes"].values()]
    return [out, f"TTFT ms, median of {res['rows'][0].get('repeats')} paired rounds. Parity: "
            f"{sum(m['ok'] for m in parity)} of {len(parity)} mode × case checks pass."]


def ttft_phases(refs) -> list:
    """One 512 px request, every mode of every preset (presets as recorded): its phases, then what one
    profiled call of it launched and how much of its wall time the GPU was busy."""
    res = refs("ttft")
    df = ttft_frame(res["rows"])
    order = {"preset": list(dict.fromkeys(df.preset)), "mode": list(TTFT_MODES)}
    one = df.query(ONE_REQUEST).sort_values(["preset", "mode"], key=lambda col: col.map(order[col.name].index))
    prof = {(p["preset"], m): r for p in res.get("profile") or [] for m in TTFT_MODES if (r := p.get(m))}

    def profiled(key: str, fmt=lambda v: f"{v:.0f}"):
        return lambda r: (lambda v: None if v is None else fmt(v))(prof.get((r["preset"], r["mode"]), {}).get(key))
    return [records(one.to_dict("records"), {
        "preset": ("preset", preset_label), "mode": ("mode", mode_label), "TTFT": ("ttft_ms", "**{:.2f}**".format),
        **{p: (f"phases_ms.{p}", ms) for p in TTFT_PHASES},
        "decode ms/token": ("decode_ms_per_token", ms), "kernels": profiled("kernels"),
        "launch calls": profiled("launch_calls"), "graph launches": profiled("graph_launches"),
        "GPU busy": profiled("busy_share", lambda v: pct(v, 0))}),
        f"Median ms; the last four columns: the mean of {(res.get('profile') or [{}])[0].get('iters')} profiled "
        "calls."]


def ttft_grid(refs) -> list:
    """Every case of the grid: TTFT all eager and both graphed, the encoder graphs' paired cut at each
    text mode (decode drift past the warning line marked), decode per token."""
    df = ttft_frame(refs("ttft")["rows"])
    ttft, dec = per_case(df, "ttft_ms"), per_case(df, "decode_ms_per_token")
    cut, drift = per_case(df, "encoder_graph_cut"), per_case(df, "decode_drift")
    out = ttft.index.to_frame(index=False).assign(preset=lambda d: d.preset.map(preset_label))  # the CASE columns
    out["TTFT all eager"], out["TTFT both graphed"] = ttft[BOTH_EAGER].map(ms).values, ttft[BOTH_GRAPHED].map(ms).values
    for m, text in ((mode_name("eager", "graphed"), "eager"), (BOTH_GRAPHED, "graphed")):
        out[f"encoder graphs' cut, text {text}"] = [
            pct(c) and pct(c) + (f" (drift {pct(d, 0, sign=True)})" if drift_beyond(d) else "")
            for c, d in zip(cut[m], drift[m])]
    out["decode ms/token, all eager → both graphed"] = _arrow(dec[BOTH_EAGER], dec[BOTH_GRAPHED]).values
    return [out, f"drift: {DRIFT}."]


def ttft_parity(refs, keep=lambda case, mode, r: True) -> pd.DataFrame:
    """Every mode's tokens against ``generate`` and first-token logits against float32, per parity case
    (``keep(case, mode, row)``: the rows to show)."""
    rows = [dict(r, case=p, mode=m) for p in refs("ttft").get("parity") or [] for m, r in p["modes"].items()
            if keep(p, m, r)]
    return records(rows, {
        "preset": lambda r: preset_label(r["case"]["preset"]), "case": lambda r: f"{r['case']['image']} ×"
        f"{r['case']['requests']}", "float32 top-2 margin": lambda r: f"{min(r['case']['fp32_top2_margin']):.3g}",
        "mode": lambda r: mode_label(r["mode"]), "logits vs float32 (transformers' bf16)": lambda r:
        f"{r['rel_err_vs_fp32']:.2e} ({r['hf_rel_err_vs_fp32']:.2e})",
        "first token as `generate`": lambda r: verdict(r["same_first_token"]),
        "first token as float32": lambda r: verdict(r["first_token_as_fp32"]),
        "tokens as `generate`": lambda r: f"{r['matching_tokens']} of {r['case']['new_tokens']}",
        "passes": lambda r: verdict(r["ok"])})


def image_path_pairs(refs, kind: str, side: str) -> list[dict]:
    """The ``ttft`` file's image-path records of ``kind``, each with the record of ``side`` for the same preset
    and workload under ``side`` (``{}`` where it has none)."""
    ip = refs("ttft").get("image_path") or []
    by_case = {(r.get("preset"), r["workload"]): r for r in ip if r["kind"] == side}
    return [dict(r, side=by_case.get((r.get("preset"), r["workload"]), {})) for r in ip if r["kind"] == kind]


IMAGE_PATH = {"preset": ("preset", preset_label), "workload": "workload", "from GPU input ms": ("gpu_ms_median", ms),
              "from CPU output ms": ("cpu_ms_median", ms), "ratio": ("ratio", times2),
              "ratio, padded float32": ("ratio_padded", times2), "ratio, chunked upload": ("ratio_chunked", times2),
              "host gather ms": ("side.gather_ms_median", ms3), "upload ms": ("side.upload_ms_median", ms3),
              "upload GB/s": ("side.upload_gb_s", lambda v: ms(v, 1)), "outputs equal": ("outputs_equal", verdict),
              "host waits": "staging.host_waits"}

PEER_LABELS = {"generate": "transformers' `generate`", "hf-static-compile": "`generate`, static cache + compile",
               "compile-ro": "`torch.compile(mode=\"reduce-overhead\")`", "engine": "`TextEngine`",
               "engine-fused": "`TextEngine(fuse=True)`"}


def _first_call(r: dict) -> str:
    first = r["first_call"]
    if first.get("capture_s") is not None:
        return f"{first['compile_s']:.1f} s compile + {first['capture_s']:.2f} s capture"
    return f"{first['first_call_s']:.1f} s"


def engine_peers(refs) -> list:
    """The text model's peers on one prompt: prefill + sample, decode per token, the first call's cost, the
    kernels of one decode step, tokens against ``generate``'s; a peer that did not run says why."""
    res = refs("engine")

    def step(r):
        s = ((res.get("profile") or {}).get(r["preset"]) or {}).get(r["mode"], {}).get("decode_step")
        return s and f"{s['kernels']:.0f}"

    def ran(cell):
        return lambda r: None if "error" in r else cell(r)
    out = records([r for r in res["rows"] if r["requests"] == 1], {
        "preset": lambda r: preset_label(r["preset"]), "mode": lambda r: PEER_LABELS.get(r["mode"], r["mode"]),
        "prefill + sample ms": ran(lambda r: ms(r["prefill_sample_ms"])),
        "decode ms/token": ran(lambda r: ms(r["decode_ms_per_token"], 3)), "first call": ran(_first_call),
        "kernels per decode step": ran(step),
        "tokens as `generate`": lambda r: f"not run: {r['error'][:80]}" if "error" in r else
        f"{r['matching_tokens']} of 16", "logits vs float32": ran(lambda r: f"{r['rel_err_vs_fp32']:.1e}")})
    floors = "; ".join(f"{preset_label(s['preset'])} {f['floor_ms']:.3f} ms ({f['param_bytes'] / 1e9:.3f} GB at "
                       f"{f['bandwidth_B_per_s'] / 1e12:.1f} TB/s)" for s in res["setup"] for f in [s["floor"]])
    eight = [f"{PEER_LABELS.get(r['mode'], r['mode'])} {ms(r['decode_ms_per_step'])} ms per step" for r in res["rows"]
             if r["requests"] > 1 and "error" not in r]
    return [out, f"One request ({res['setup'][0]['prompt_len']} positions), median ms of "
            f"{res['rows'][0].get('repeats')} rounds. The weights' floor per decode step: {floors}. "
            f"Eight requests: {', '.join(eight)}."]


def e2e(refs) -> list:
    """TTFT inside ``generate``: transformers' image path against the graphed encoder installed."""
    df = refs.frame("e2e", "decode_drift")
    hf, g = (df[df["mode"] == m].drop_duplicates(CASE, keep="last").set_index(CASE) for m in ("hf-eager", "lab-graph"))
    d = g.join(hf, how="inner", suffixes=("", "_hf")).reset_index()

    def change(cut):
        return pct(-cut, sign=True)  # a cut, as the change it is
    return [records(d.to_dict("records"), {
        "preset": ("preset", preset_label), "image": "image", "requests": "requests",
        "TTFT transformers": ("ttft_ms_hf", ms), "TTFT graphed encoder": ("ttft_ms", ms),
        "change (medians)": ("ttft_reduction", change), "change (paired)": ("ttft_reduction_paired", change),
        "encoder ms": lambda r: f"{ms(r['encoder_ms_hf'])} → {ms(r['encoder_ms'])}",
        "decode drift": ("decode_drift", lambda v: pct(v, 0, True) + " (disturbed)" * drift_beyond(v))}),
        f"Median ms of {df.repeats.iloc[0]} rounds. disturbed: {DRIFT}."]


REQUEST_ROLE = "request-3b"
REQUESTS = (1, 2, 4)  # the low batch sizes the PR's claim is about
NOT_RECORDED = f"_Not in this reference set: `python -m lfm2vl_lab record` records role `{REQUEST_ROLE}`._"


def _tokens(refs) -> int:
    return next((r["e2e_tokens"] for r in refs(REQUEST_ROLE)["rows"] if "e2e_tokens" in r), NEW_TOKENS)


def e2e_cells(refs) -> dict[tuple, dict]:
    """Per (preset, image, requests), its rows by mode: e2e ms, its source, and the encoder graphs' cut. The
    measured whole requests (``request-3b``) stand where the set has them, the rest is composed from the
    TTFT grid's measured parts (:func:`~lfm2vl_lab.measure.request.composed_e2e`)."""
    tokens, cells = _tokens(refs), {}
    for r in refs("ttft")["rows"]:
        if r["requests"] in REQUESTS:
            cells.setdefault((r["preset"], r["image"], r["requests"]), {})[r["mode"]] = dict(
                r, e2e_ms=composed_e2e(r, tokens), e2e_source="composed")
    for r in (r for m in cells.values() for r in m.values() if r["encoder_mode"] == "graphed"):
        eager = cells[r["preset"], r["image"], r["requests"]][mode_name(r["text_mode"], "eager")]
        r["e2e_cut"] = 1 - r["e2e_ms"] / eager["e2e_ms"]
    for r in refs(REQUEST_ROLE)["rows"]:
        if "e2e_ms" in r and r["requests"] in REQUESTS:
            cells.setdefault((r["preset"], r["image"], r["requests"]), {})[r["mode"]] = r
    return cells


def e2e_requests(refs) -> list:
    """Whole requests at 1, 2 and 4 requests, encoder eager → graphed, text graphed and eager, each row saying
    whether it was measured or composed; the note says how far the composition lands from the measured rows."""
    rows, checks = [], []
    for (preset, image, n), m in e2e_cells(refs).items():
        row = {"preset": preset_label(preset), "image": image, "requests": n}
        for t, head in (("graphed", "text graphed"), ("eager", "text eager (composed)")):
            e, g = m.get(mode_name(t, "eager")) or {}, m.get(mode_name(t, "graphed")) or {}
            cut = pct(g.get("e2e_cut"))  # (drift): the decode control failed, the decodes differ more than the saving
            row[f"{head}: ms, encoder eager → graphed"] = f"{ms(e.get('e2e_ms'), 1)} → {ms(g.get('e2e_ms'), 1)}"
            row[f"cut, {head}"] = cut and cut + " (drift)" * drift_fails(g)
            if t == "graphed":
                row["text graphed: measured or composed"] = g.get("e2e_source", "composed")
            checks += [c for c in [e and g and composition_check(e, g)] if c]
        rows.append(row)
    ms_gap = max((abs(x) for c in checks for x in c["ms_error"]), default=None)
    cut_gap = max((abs(c["cut_error"]) for c in checks), default=None)
    check = (f"On the {len(checks)} measured rows the same composition lands within {pct(ms_gap)} of each measured "
             f"whole request, its cut off by up to {100 * cut_gap:.1f} points." if checks else
             "No row was measured, so the composition's error is not known here.")
    return [pd.DataFrame(rows, dtype=object), f"Whole requests of {_tokens(refs)} output tokens, medians. {check} "
            f"(drift): {DRIFT}."]


def throughput(refs) -> list:
    """The offline-throughput run: requests and tokens per second, encoder eager and graphed."""
    res = refs(REQUEST_ROLE)
    if not res.get("throughput"):
        return "_This request file has no throughput run._"
    tp = res["throughput"][0]
    rows = [dict(r, preset=t["preset"], encoder=m.split("+")[1].replace("encoder-", "encoder "))
            for t in res["throughput"] for m, r in t["modes"].items()]
    return [records(rows, {"preset": ("preset", preset_label), "encoder": "encoder",
                           "requests/s": ("requests_per_s", "{:.2f}".format),
                           "output tokens/s": ("tokens_per_s", "{:.0f}".format), "s per pass": ("pass_s", ms)}),
            f"{tp['requests']} requests, batches of up to {tp['batch']}, {tp['new_tokens']} output tokens each; median "
            f"of {tp['passes']} passes in turns. Encoder graphs: {times(tp['speedup'], 3)} the throughput."]


def _pairs(kind: str, side: str, cols: dict) -> Part:
    return Part(("ttft",), lambda refs: records(image_path_pairs(refs, kind, side), cols))


BLOCKS = {"ttft-modes": Part(("ttft",), ttft_modes), "ttft-phases": Part(("ttft",), ttft_phases),
          "ttft-grid": Part(("ttft",), ttft_grid),
          "ttft-parity": Part(("ttft",), lambda refs: ttft_parity(refs)),
          "image-path": _pairs("encode_sources", "staging_split", IMAGE_PATH),
          "engine-peers": Part(("engine",), engine_peers), "e2e": Part(("e2e",), e2e),
          "e2e-requests": Part((REQUEST_ROLE, "ttft"), e2e_requests, missing=NOT_RECORDED),
          "throughput": Part((REQUEST_ROLE,), throughput, missing=NOT_RECORDED),
          "like-for-like": Part((REQUEST_ROLE,), lambda refs: like_for_like(refs(REQUEST_ROLE)), missing=NOT_RECORDED)}
