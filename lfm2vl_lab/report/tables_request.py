"""The parts made from whole requests (:mod:`~lfm2vl_lab.measure.request`): the end-to-end table with
decode, the offline-throughput run, and the PR's claim like for like.

The 3B rows come from the ``request-3b`` file: measured whole requests where the text model is
graphed, composed from the measured parts where it is eager. The 450M and 1.6B rows are composed
from the ``ttft`` grid's parts (:func:`~lfm2vl_lab.measure.request.composed_e2e`), at the same number
of output tokens; the 3B file's graphed rows carry both, which says how close the composition is.
"""

from __future__ import annotations

from ..measure.e2e import DECODE_DRIFT_WARN
from ..measure.request import NEW_TOKENS, STAND_IN, composed_e2e, composition_check, like_for_like
from ..measure.ttft import mode_name
from .frames import Refs, ms, needs, pct, preset_label, table, times
from .ttft_summary import drift_fails

REQUEST_ROLE = "request-3b"
REQUESTS = (1, 2, 4)  # the low batch sizes the PR's claim is about


# the parts below are drawn from the request file
request_part = needs(REQUEST_ROLE, f"_Not in this reference set: `python -m lfm2vl_lab record` records role "
                     f"`{REQUEST_ROLE}` (`record --dry-run` shows its command)._")


def _tokens(refs: Refs) -> int:
    return next((r["e2e_tokens"] for r in refs(REQUEST_ROLE)["rows"] if "e2e_tokens" in r), NEW_TOKENS)


def e2e_cells(refs: Refs) -> list[dict]:
    """One dict per (preset, image, requests): e2e ms per mode, its source, and the encoder graphs' cuts."""
    tokens = _tokens(refs)
    grid = [dict(r, e2e_ms=composed_e2e(r, tokens), e2e_source="composed") for r in refs("ttft")["rows"]
            if r["requests"] in REQUESTS]
    for r in grid:
        if r["encoder_mode"] == "graphed":
            eager = next(e for e in grid if (e["preset"], e["image"], e["requests"], e["mode"])
                         == (r["preset"], r["image"], r["requests"], mode_name(r["text_mode"], "eager")))
            r["e2e_cut"] = 1 - r["e2e_ms"] / eager["e2e_ms"]
    rows = grid + [r for r in refs(REQUEST_ROLE)["rows"] if "e2e_ms" in r and r["requests"] in REQUESTS]
    cells: dict[tuple, dict] = {}
    for r in rows:
        c = cells.setdefault((r["preset"], r["image"], r["requests"]), {})
        c[r["mode"]] = r
    return [{"case": k, "modes": v} for k, v in cells.items()]


def _check_cell(check: dict | None) -> str | None:
    """A measured row's composition beside it: composed ms eager → graphed, the cut it gives, its error."""
    if check is None:
        return None
    (ce, cg), err = check["composed_ms"], check["cut_error"]
    return f"{ms(ce, 1)} → {ms(cg, 1)}, {pct(check['cut'])} ({100 * err:+.1f} points)"


@request_part
def e2e_requests_block(refs: Refs, res: dict) -> str:
    """Whole requests with decode at 1, 2 and 4 requests: encoder eager → graphed, text graphed and eager.
    Each text-graphed row says whether it was measured or composed from parts; a measured row also gives
    what the composition makes of it, so the composed rows beside it carry a known error."""
    tokens = _tokens(refs)
    out, checks = [], []
    for cell in e2e_cells(refs):
        (preset, image, n), m = cell["case"], cell["modes"]
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
                  f"whole request, and its cut is off by up to {100 * cut_gap:.1f} points (the error in brackets); "
                  "the composed rows of the other presets have no measurement beside them. " if checks else
                  "No row was measured, so the composition's error is not known here. ")
    note = (f"Whole requests of {tokens} output tokens, bf16, medians; processor to tokens on the host. "
            f"Measured: whole requests in paired turns (text model graphed, the `{REQUEST_ROLE}` file). "
            "Composed: the request to its first token plus the decode steps, each measured "
            f"(`request.composed_e2e`). {check_note}"
            "The text model eager is transformers' own, and its rows are composed on every preset. (drift): the "
            f"cell's decode control fails, its two encoder modes decoded more than {pct(DECODE_DRIFT_WARN, 0)} "
            "apart although decode never runs the encoder, so that cut is not the encoder alone. "
            f"{STAND_IN[0].upper() + STAND_IN[1:]}.")
    return table(head, out) + "\n\n" + note + "\n\n" + refs.source(REQUEST_ROLE, "ttft")


@request_part
def throughput_block(refs: Refs, res: dict) -> str:
    """The offline-throughput run: requests and tokens per second, encoder eager and graphed."""
    out = []
    for tp in res.get("throughput", []):
        for m, r in tp["modes"].items():
            out.append([preset_label(tp["preset"]), m.split("+")[1].replace("encoder-", "encoder "),
                        f"{r['requests_per_s']:.2f}", f"{r['tokens_per_s']:.0f}", ms(r["pass_s"], 2)])
    if not out:
        return "_This request file has no throughput run._"
    tp = res["throughput"][0]
    note = (f"{tp['requests']} requests of the seeded workload's mixed image sizes, in arrival order, batches of up to "
            f"{tp['batch']}, {tp['new_tokens']} output tokens each, text model graphed; median of {tp['passes']} "
            f"passes in turns. Encoder graphs: {times(tp['speedup'], 3)} the throughput.")
    return (table(["preset", "encoder", "requests/s", "output tokens/s", "s per pass"], out) + "\n\n" + note
            + "\n\n" + refs.source(REQUEST_ROLE))


@request_part
def like_for_like_block(refs: Refs, res: dict) -> str:
    """The PR's claim, like for like: one sentence from the request file."""
    return like_for_like(res) + "\n\n" + refs.source(REQUEST_ROLE)


BLOCKS = {"e2e-requests": e2e_requests_block, "throughput": throughput_block, "like-for-like": like_for_like_block}
