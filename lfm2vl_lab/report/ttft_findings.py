"""What the recorded TTFT and end-to-end files show, in the sentences notebook 07 prints; cases failing
the decode control are left out and named, and a file lacking what a sentence needs says so."""

from __future__ import annotations

from ..measure.ttft import mode_name
from .frames import missing
from .plots_ttft import case_name, per_case, ttft_case, ttft_cases, ttft_frame
from .ttft_summary import PR_CLAIM, _not_recorded, decode_ratios, drift_beyond, range_verdict


def coverage(rows: list[dict]) -> dict:
    """What TTFT or e2e ``rows`` cover: presets, images, requests, modes, cases, tokens and repeats."""
    rows = [r for r in rows if r.get("mode")]

    def seen(key):  # in first-seen order
        return list(dict.fromkeys(r[key] for r in rows))
    return {"presets": seen("preset"), "images": seen("image"), "requests": sorted(set(seen("requests"))),
            "modes": seen("mode"), "cases": len(dict.fromkeys((r["preset"], r["image"], r["requests"]) for r in rows)),
            "new_tokens": sorted({int(k.split("_")[1]) for r in rows for k in r
                                  if k.startswith("total_") and k.endswith("_ms")}),
            "decode_tokens": sorted({r["decode_tokens"] for r in rows if r.get("decode_tokens")}),
            "repeats": sorted({r["repeats"] for r in rows if r.get("repeats")})}


def _join(xs) -> str:
    return ", ".join(map(str, xs))


def coverage_text(rows: list[dict]) -> str:
    """:func:`coverage` as one line, for a cell that says what a recorded file holds before showing it."""
    c = coverage(rows)
    if not c["cases"]:
        return _not_recorded("rows")
    parts = [f"{c['cases']} cases: presets {_join(c['presets'])}; images {_join(c['images'])}; "
             f"requests {_join(c['requests'])}", f"modes {_join(c['modes'])}"]
    parts += [text.format(_join(c[key])) for key, text in (("new_tokens", "generate timed to {} new tokens"),
                                                          ("decode_tokens", "{} decode tokens"),
                                                          ("repeats", "{} repeats")) if c[key]]
    return "covers " + "; ".join(parts)


def encoder_cuts(rows: list[dict], text_mode: str = "graphed") -> list[dict]:
    """The encoder graphs' paired TTFT cut per case of a TTFT grid at one text mode:
    ``{"case", "cut", "drift"}`` (drift: the graphed-encoder row's ``decode_drift``, or None)."""
    df, graphed = ttft_frame(rows), mode_name(text_mode, "graphed")
    cuts, drifts = per_case(df, "encoder_graph_cut")[graphed], per_case(df, "decode_drift")[graphed]
    return [{"case": case, "cut": cut, "drift": None if missing(drift) else drift}
            for case, cut, drift in zip(cuts.index, cuts, drifts) if not missing(cut)]


def e2e_cuts(rows: list[dict], mode: str = "lab-graph") -> list[dict]:
    """The graphed encoder's TTFT cut inside ``generate`` per case of an e2e file (paired where it was),
    with its ``decode_drift``."""
    out = []
    for r in rows:
        cut = r.get("ttft_reduction_paired", r.get("ttft_reduction"))
        if r.get("mode") == mode and cut is not None:
            out.append({"case": (r["preset"], r["image"], r["requests"]), "cut": cut, "drift": r.get("decode_drift")})
    return out


def cut_range(cuts: list[dict], requests: int | None = None) -> dict:
    """The range of ``cuts`` (only ``requests``' cases, if given) over the cases whose decode control
    holds, with those ``kept``, ``left_out`` and ``unchecked`` (kept without a drift)."""
    cuts = [c for c in cuts if requests is None or c["case"][2] == requests]
    kept = [c for c in cuts if not drift_beyond(c["drift"])]
    return {"lo": min((c["cut"] for c in kept), default=None), "hi": max((c["cut"] for c in kept), default=None),
            "kept": kept, "left_out": [c for c in cuts if drift_beyond(c["drift"])],
            "unchecked": sum(c["drift"] is None for c in kept)}


def range_text(cuts: list[dict], requests: int | None = None, claim: tuple | None = None) -> str:
    """:func:`cut_range` in words: the range, over how many cases, where it stands against ``claim`` (a
    ``(lo, hi)`` range such as :data:`PR_CLAIM`; :func:`range_verdict`), and which cases were left out and why."""
    r = cut_range(cuts, requests)
    n = len(r["kept"]) + len(r["left_out"])
    if not n:
        return _not_recorded("such cases")
    what = "one request" if requests == 1 else f"{requests} requests" if requests else "every case"
    line = (f"{what}: {r['lo']:.1%} to {r['hi']:.1%} over {len(r['kept'])} of {n} cases" if r["kept"]
            else f"{what}: none of {n} cases passes the decode control")
    if r["kept"] and claim is not None:
        line += f", {range_verdict(r['lo'], r['hi'], claim)} the PR's {claim[0]:.0%}-{claim[1]:.0%}"
    if r["left_out"]:
        line += "; left out, decode control fails: " + ", ".join(
            f"{case_name(c['case'])} (drift {c['drift']:+.0%})" for c in r["left_out"])
    if r["unchecked"]:
        line += f"; {r['unchecked']} without a decode control"
    return line


def claim_ranges_text(ttft_rows: list[dict], e2e_rows: list[dict] | None = None) -> str:
    """The PR's claim beside the encoder graphs' TTFT cut ranges: the grid with the text model graphed
    and eager, and inside ``generate`` (``e2e_rows``, if given)."""
    lo, hi = PR_CLAIM
    settings = [("engine grid, text model graphed (as in vLLM)", encoder_cuts(ttft_rows, "graphed")),
                ("engine grid, text model eager", encoder_cuts(ttft_rows, "eager"))]
    if e2e_rows is not None:
        settings.append(("inside generate (transformers, text model eager)", e2e_cuts(e2e_rows)))
    lines = [f"vLLM PR #44930: about {lo:.0%}-{hi:.0%} lower end-to-end latency at low batch size, its text model "
             "graphed. The encoder graphs' paired TTFT cut here:"]
    for name, cuts in settings:
        lines += [f"{name}:"] + ["  " + range_text(cuts, requests=n, claim=PR_CLAIM) for n in (1, None)]
    return "\n".join(lines)


def decode_speedup_text(rows: list[dict]) -> str:
    """Decode per token with the text model eager over graphed (at the eager encoder: decode never runs
    it) as a range over the cases whose decode control holds, per preset."""
    ups = decode_ratios(rows, mode_name("eager", "eager"), mode_name("graphed", "eager"))
    if ups.empty:
        return _not_recorded("TTFT rows with decode per token in both text modes")
    lines = []
    for preset, mine in ups.groupby(level="preset", sort=False):
        kept, left = mine[~mine.disturbed], [case_name(c) for c in mine.index[mine.disturbed]]
        line = (f"{preset}: decode per token is {kept.ratio.min():.1f}x to {kept.ratio.max():.1f}x faster with "
                f"the text model graphed, over {len(kept)} of {len(mine)} cases" if len(kept) else
                f"{preset}: no case passes the decode control")
        lines.append(line + (f" (left out, decode control fails: {', '.join(left)})" if left else ""))
    return "\n".join(lines)


def ttft_sentence(rows: list[dict], preset: str = "lfm2-vl-450m", image: str = "1x512", requests: int = 1) -> str:
    """One case's TTFT with everything eager and with both graphed (the processor, on the CPU, left out)."""
    by = ttft_case(rows, preset, image, requests)
    e, g = by.get(mode_name("eager", "eager")), by.get(mode_name("graphed", "graphed"))
    if e is None or g is None:
        return f"{case_name((preset, image, requests))}: {_not_recorded('all-eager and both-graphed rows')}"
    return (f"{case_name((preset, image, requests))}: TTFT {e['ttft_ms']:.2f} ms with everything eager, "
            f"{g['ttft_ms']:.2f} ms with the text model and the encoder graphed ({e['ttft_ms'] / g['ttft_ms']:.1f}x)")


def image_path_text(result: dict) -> str:
    """Per preset and workload of the file's ``image_path`` section: how long ``encode()`` takes from
    pixels in host memory against pixels already on the GPU."""
    rows = [r for r in result.get("image_path") or [] if r.get("kind") == "encode_sources"]
    if not rows:
        return _not_recorded("image_path section (ttft --image-path records one)")
    return "\n".join(f"{r.get('preset', '?')} {r['workload']}: encode() takes {r['ratio']:.2f}x as long from pixels "
                     f"in host memory as from pixels already on the GPU ({r['cpu_ms_median']:.2f} against "
                     f"{r['gpu_ms_median']:.2f} ms)" for r in rows)


def first_tokens_text(result: dict) -> str:
    """Whether every mode's first tokens equal all-eager's, per case; where not, float32's top-2 margin
    (a near tie bf16 can tip) and which modes chose float32's token."""
    rows, cases = result.get("rows") or [], ttft_cases(result.get("rows") or [])
    if not cases:
        return _not_recorded("TTFT rows")
    bad = {c: [m for m, r in ttft_case(rows, *c).items() if not r.get("same_first_tokens", True)] for c in cases}
    bad = {c: modes for c, modes in bad.items() if modes}
    lines = [f"every mode's first tokens equal the all-eager mode's in {len(cases) - len(bad)} of {len(cases)} cases"]
    for c, modes in bad.items():
        line = f"  {case_name(c)}: {', '.join(modes)} differ"
        p = next((p for p in result.get("parity") or [] if (p.get("preset"), p.get("image"), p.get("requests"))
                  == c), None)
        if p is not None:
            fp32 = [m for m, r in p["modes"].items() if r.get("first_token_as_fp32")]
            line += (f"; float32's top-2 logit margin {min(p.get('fp32_top2_margin') or [float('nan')]):.3g}, "
                     f"float32's first token chosen by {', '.join(fp32) or 'no mode'}")
        lines.append(line)
    return "\n".join(lines)
