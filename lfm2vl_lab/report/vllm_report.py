"""How a ``vllm`` result reads: the terminal's summary, and the lines and tables made from the file.

Every number here is read from the result file (:mod:`.cli_vllm` writes it); nothing is measured.
"""

from __future__ import annotations

from ..measure.vllm_ab import ARMS, CASES, TOKENS, case_name


def pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:+.1f}%".replace("+-", "−").replace("-", "−")


def cut_text(cut: dict | None) -> str:
    """A paired cut as a saving with its interval: ``−37.2% [−40.1, −33.0]`` reads "37% faster"."""
    if not cut:
        return "–"
    lo, hi = cut["ci"]
    return f"{pct(-cut['cut'])} [{100 * -hi:+.1f}, {100 * -lo:+.1f}]".replace("-", "−")


def rows_of(result: dict, engine: str = "vllm", preset: str | None = None) -> list[dict]:
    return [r for r in result["rows"] if r.get("engine") == engine and (preset is None or r["preset"] == preset)]


def find(result: dict, engine: str, preset: str, case: str, tokens: int, arm: str) -> dict | None:
    return next((r for r in rows_of(result, engine, preset)
                 if (r["case"], r["tokens"], r["arm"]) == (case, tokens, arm)), None)


def parity_line(preset: str, sec: dict) -> str:
    """One line per preset: does each engine pass the kit's parity rule on the shared weights."""
    bits = []
    for arm, cases in sec.get("parity", {}).items():
        ok = all(c["logits_ok"] for c in cases.values())
        same = all(c["same_prompt_ids"] for c in cases.values())
        worst = max(c["rel_err_vs_fp32"] for c in cases.values())
        follow = min(c["as_fp32"] for c in cases.values())
        bits.append(f"{arm} {'ok' if ok else 'FAILED'} (logits {worst:.1e} from float32, {follow}+ tokens on "
                    f"float32's path{'' if same else ', prompt ids differ from the kit'})")
    return f"{preset} parity: " + "; ".join(bits)


def summary_lines(result: dict) -> list[str]:
    """The terminal's summary: per preset, engine start-up, parity, and per case the medians of each
    engine arm with the graphed arms' paired cuts (95% interval), and the kit's pipeline beside."""
    out = []
    for preset, sec in result["presets"].items():
        starts = ", ".join(f"{a} {e['start_s']:.0f} s" for a, e in sec["engines"].items())
        out += [f"{preset}: engines started in {starts}", parity_line(preset, sec)]
        for image, n in CASES:
            case = case_name(image, n)
            for tokens in TOKENS:
                cells = {"vLLM": [], "the kit's pipeline": []}
                for arm in ARMS:
                    for engine, label in (("vllm", "vLLM"), ("kit", "the kit's pipeline")):
                        r = find(result, engine, preset, case, tokens, arm)
                        if r is None:
                            continue
                        cut = "" if arm == "off" else \
                            f" (TTFT {cut_text(r.get('ttft_cut'))}, e2e {cut_text(r.get('e2e_cut'))})"
                        cells[label].append(f"{arm} {r['ttft_ms']:.1f}/{r['e2e_ms']:.1f}{cut}")
                shown = " | ".join(f"{k}: " + ", ".join(v) for k, v in cells.items() if v)
                out.append(f"  {case:>6} {tokens:>3} tokens, TTFT/e2e ms: {shown}")
    if result.get("errors"):
        out += [f"error: {e['error']}" for e in result["errors"]]
    return out
