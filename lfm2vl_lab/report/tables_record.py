"""The record itself: the manifest (``reference-set``), what a re-record costs after a change
(``record-cost``), and the goal that a full record of the kit's own roles fits in :data:`RECORD_LIMIT_S`."""

from __future__ import annotations

import statistics
from datetime import datetime, timedelta

from .frames import Refs, facts, ms, pct, table

RECORD_LIMIT_S = 600  # a full record of the kit's own roles fits in a third of a session's device time
# The roles whose rows keep every timed sample in round order, and their key; a median that moves by more
# than SPREAD_LIMIT when the last round goes would change what the pages say of it.
SAMPLED = {"ttft": "ttft_samples_ms", "request-3b": "ttft_samples_ms", "e2e": "ttft_samples_ms",
           "engine": "prefill_sample_samples_ms"}
SPREAD_LIMIT = 0.02
# The set-up seconds the files record, by key; a bench row's ``capture_info`` splits its ``capture_s``
# by budget, so it is not walked, and rows of one capture repeat its value, so each value counts once.
SETUP_KEYS = {"compile_s": "compile", "compile_first_call_s": "compile", "capture_s": "capture"}


def reference_block(refs: Refs) -> str:
    """The manifest: when and from which code the run was recorded, and each role's file."""
    man = refs.manifest
    code = {role: e.get("code_hash", man["code_hash"]) for role, e in man["files"].items()}
    rows = [[f"`{role}`", f"`{e['file']}`", e.get("part"), e.get("rc"), ms(e.get("seconds"), 0),
             f"`{code[role][7:19]}`"] for role, e in man["files"].items()]
    prov = refs(next(iter(man["files"])))["provenance"]
    return "\n\n".join([
        f"`{man['command']}` on one {man['gpu']}, {man['started'][:16].replace('T', ' ')} to "
        f"{str(man['finished'])[:16].replace('T', ' ')} UTC; {len(set(code.values()))} code version(s); "
        f"{'complete' if man['complete'] else 'incomplete'}, failed steps: "
        f"{', '.join(man.get('failed') or {}) or 'none'}. torch {prov.get('torch')}, CUDA {prov.get('cuda')}, "
        f"transformers {prov.get('transformers')}, Python {prov.get('python')}.",
        table(["role", "file", "part", "exit status", "seconds", "code"], rows),
        refs.source()])


def _beside_seconds(man: dict, step) -> str:
    """A role beside the set: the sum over its calls, or only its last call's seconds (said so) in an older entry."""
    entry = man["files"][step.role]
    if entry.get("calls"):
        return f"{entry['seconds']:.0f} ({len(entry['calls'])} calls: " + " + ".join(
            f"{c:.0f}" for c in entry["calls"]) + ")"
    return f"{entry['seconds']:.0f}" + (" (its last call only)" if step.resumable else "")


def record_cost_block(refs: Refs) -> str:
    """Every role, then what ``record --changed`` re-runs after a change to each group of files (the files
    that move the same roles), with the seconds those roles took in the set."""
    from ..measure.record import STEPS
    from ..measure.role_code import measured_files

    man, groups = refs.manifest, {}
    recorded = [s for s in STEPS if s.role in man["files"]]
    seconds = {s.role: man["files"][s.role].get("seconds") or 0 for s in recorded}
    closure = {s.role: set(measured_files(s.modules)) for s in recorded}
    for f in sorted(set().union(*closure.values())):
        groups.setdefault(tuple(r for r in closure if f in closure[r]), []).append(f)
    own = [s.role for s in recorded if not s.beside]
    device, calls = device_seconds([man["files"][r] for r in own])
    rows = [[f"every role of the kit's own ({len(own)})", "a full `record`", f"{device:.0f}" + "".join(
        f" (on {c['gpus']} GPUs at once: {c['steps']:.0f} s of steps in {c['span']:.0f} s)" for c in calls)]]
    rows += [[f"`{s.role}` (beside the set, timed apart)", f"`record --part {s.part}`",
              _beside_seconds(man, s)] for s in recorded if s.beside]
    last_only = {s.role for s in recorded if s.resumable and not man["files"][s.role].get("calls")}  # a lower bound
    for roles, files in sorted(groups.items(), key=lambda kv: (-sum(seconds[r] for r in kv[0]), kv[1])):
        shown = ", ".join(f"`{f.removeprefix('lfm2vl_lab/')}`" for f in files[:6])
        rows.append([shown + (f" and {len(files) - 6} more" if len(files) > 6 else ""),
                     "all" if len(roles) == len(recorded) else ", ".join(f"`{r}`" for r in roles),
                     ("≥ " if last_only & set(roles) else "") + f"{sum(seconds[r] for r in roles):.0f}"])
    return "\n\n".join([table(["a change to", "re-records", "seconds of steps"], rows), refs.source()])


def _record_seconds(refs: Refs) -> list[tuple[float, str]]:
    """``(seconds, role)`` of each of the kit's own steps (vLLM's is timed apart), longest first."""
    from ..measure.record import STEPS

    files = refs.manifest["files"]
    return sorted(((files[s.role].get("seconds") or 0, s.role) for s in STEPS if s.role in files and not s.beside),
                  reverse=True)


def device_seconds(entries: list[dict]) -> tuple[float, list[dict]]:
    """The device seconds of manifest ``entries``, and the calls among them on several GPUs (``gpus``, their
    ``steps``' seconds, their ``span``): such a call costs its span, from its first step's start to its last's end."""
    alone, calls = 0.0, {}
    for e in entries:
        if (e.get("gpus") or 1) > 1:
            calls.setdefault(e["call"], []).append(e)
        else:
            alone += e.get("seconds") or 0
    spans = []
    for es in calls.values():
        ends = [datetime.fromisoformat(e["date"]) for e in es]
        ran = [(e.get("calls") or [e.get("seconds") or 0])[-1] for e in es]  # a resumed role: this call's part
        alone += sum((e.get("seconds") or 0) - r for e, r in zip(es, ran))  # and its earlier calls, as they were
        start = min(end - timedelta(seconds=r) for end, r in zip(ends, ran))
        spans.append({"gpus": max(e["gpus"] for e in es), "steps": sum(ran),
                      "span": (max(ends) - start).total_seconds()})
    return alone + sum(c["span"] for c in spans), spans


def record_goals(refs: Refs) -> list[dict]:
    secs = _record_seconds(refs)
    total, calls = device_seconds([refs.manifest["files"][r] for _, r in secs])
    return [{"target": "a full record of the kit's own roles, steps in s", "limit": RECORD_LIMIT_S,
             "value": total, "ok": total <= RECORD_LIMIT_S, "detail": f"{len(secs)} roles" + "".join(
                 f"; on {c['gpus']} GPUs at once, {c['steps']:.0f} s of steps in {c['span']:.0f} s" for c in calls)}]


def setup_seconds(res: dict) -> dict[str, float]:
    """``{"compile": s, "capture": s}``: the distinct set-up seconds a result file records."""
    seen: dict[str, set] = {"compile": set(), "capture": set()}

    def walk(o) -> None:
        for k, v in (o.items() if isinstance(o, dict) else enumerate(o) if isinstance(o, list) else ()):
            if k in SETUP_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool):
                seen[SETUP_KEYS[k]].add(v)
            elif k != "capture_info":
                walk(v)

    walk(res)
    return {k: sum(v) for k, v in seen.items()}


def explain_record(refs: Refs) -> str:
    """Per step its seconds, compiles and captures; how the steps were launched; the repeats' spread."""
    secs = _record_seconds(refs)
    setup = {r: setup_seconds(refs(r)) for _, r in secs}
    rows = [[f"`{r}`", f"{v:.0f}", ms(setup[r]["compile"], 1) if setup[r]["compile"] else None,
             ms(setup[r]["capture"], 1) if setup[r]["capture"] else None,
             f"{v - setup[r]['compile'] - setup[r]['capture']:.0f}"] for v, r in secs]
    rows.append(["**all**", f"{sum(v for v, _ in secs):.0f}",
                 *(f"{sum(s[k] for s in setup.values()):.0f}" for k in ("compile", "capture")),
                 f"{sum(v - s['compile'] - s['capture'] for (v, _), s in zip(secs, setup.values())):.0f}"])
    entries = [refs.manifest["files"][r] for _, r in secs]
    forked = [e for e in entries if e.get("launch") == "forkserver"]
    comp = sum(s["compile"] for s in setup.values())
    return "\n\n".join([
        table(["step", "seconds", "compiles recorded (s)", "captures recorded (s)",
               "the rest (s)"], rows),
        facts([["steps forked from a forkserver (its imports, s)",
                f"{len(forked)} of {len(entries)} ({sum(e.get('forkserver_s') or 0 for e in forked):.0f})"],
               ["steps compiling into empty caches of their own (cold)",
                f"{sum(e.get('compile_cache') == 'empty' for e in entries)} of {len(entries)}"],
               ["the recorded first compiles' share of the limit", f"{comp / RECORD_LIMIT_S:.0%}"],
               *([f"on {c['gpus']} GPUs at once: s of steps, span", f"{c['steps']:.0f}, {c['span']:.0f}"]
                 for c in device_seconds(entries)[1])]),
        repeat_spread_text(refs)])


def round_fewer_move(samples: list[float]) -> float:
    """How far one round fewer moves the median of ``samples`` (in round order), as a fraction."""
    return abs(statistics.median(samples[:-1]) / statistics.median(samples) - 1)


def repeat_spread(refs: Refs) -> list[dict]:
    """Per sampled role: how far each row's median moves without its last round (one repeat fewer)."""
    out = []
    for role, key in SAMPLED.items():
        if role not in refs.manifest["files"]:
            continue
        samples = [r[key] for r in refs(role).get("rows") or [] if len(r.get(key) or []) >= 3]
        if samples:
            moves = [round_fewer_move(s) for s in samples]
            out.append({"role": role, "repeats": len(samples[0]), "rows": len(moves), "worst": max(moves),
                        "over": sum(m > SPREAD_LIMIT for m in moves)})
    return out


def repeat_spread_text(refs: Refs) -> str:
    """:func:`repeat_spread` as a table, and what the benches' timed calls take (composed)."""
    rows = [[f"`{s['role']}`", s["repeats"], pct(s["worst"]), f"{s['over']} of {s['rows']}",
             "no" if s["over"] else "yes"] for s in repeat_spread(refs)]
    timed = steps = 0.0
    for seconds, role in _record_seconds(refs):
        bench = refs(role).get("rows") or []
        if bench and all("median_ms" in r and "repeats" in r for r in bench):
            timed += sum(r["median_ms"] * (r["repeats"] + r.get("warmup", 0)) for r in bench) / 1e3
            steps += seconds
    return "\n\n".join([table(["step", "repeats", "largest move of a median without the last round",
                               f"rows moving over {pct(SPREAD_LIMIT, 0)}", "one repeat fewer allowed"], rows)
                        if rows else "No role of this set keeps its timed samples."]
                       + ([f"The benches keep percentiles, not samples; their timed calls take about {timed:.0f} s "
                           f"of their {steps:.0f} s (median × calls, composed)."] if steps else []))


BLOCKS = {"reference-set": reference_block, "record-cost": record_cost_block}
