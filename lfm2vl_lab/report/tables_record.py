"""The record itself: the manifest (``reference-set``), and the goal that a full record of the kit's own roles
fits in :data:`RECORD_LIMIT_S`, with what explains a miss of it (each step's compiles and captures)."""

from __future__ import annotations

from datetime import datetime, timedelta

from ..measure.results import target_row
from .frames import ms, part, table

RECORD_LIMIT_S = 600  # a full record of the kit's own roles fits in a third of a session's device time
# The set-up seconds the files record, by key; a bench row's ``capture_info`` splits its ``capture_s``
# by budget, so it is not walked, and rows of one capture repeat its value, so each value counts once.
SETUP_KEYS = {"compile_s": "compile", "compile_first_call_s": "compile", "capture_s": "capture"}


def reference_set(refs) -> list:
    """The manifest: when and from which code the run was recorded, and each role's file."""
    man = refs.manifest
    code = {role: e.get("code_hash", man["code_hash"]) for role, e in man["files"].items()}
    prov = refs(next(iter(man["files"])))["provenance"]
    return [f"`{man['command']}` on one {man['gpu']}, {man['started'][:16].replace('T', ' ')} to "
            f"{str(man['finished'])[:16].replace('T', ' ')} UTC; {len(set(code.values()))} code version(s); "
            f"{'complete' if man['complete'] else 'incomplete'}, failed steps: "
            f"{', '.join(man.get('failed') or {}) or 'none'}. torch {prov.get('torch')}, CUDA {prov.get('cuda')}, "
            f"transformers {prov.get('transformers')}, Python {prov.get('python')}.",
            table(["role", "file", "part", "exit status", "seconds", "code"], [
                [f"`{role}`", f"`{e['file']}`", e.get("part"), e.get("rc"), ms(e.get("seconds"), 0),
                 f"`{code[role][7:19]}`"] for role, e in man["files"].items()]), refs.source()]


def _record_seconds(refs) -> list[tuple[float, str]]:
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


def record_goals(refs) -> list[dict]:
    secs = _record_seconds(refs)
    total, calls = device_seconds([refs.manifest["files"][r] for _, r in secs])
    return [target_row("a full record of the kit's own roles, steps in s", total, RECORD_LIMIT_S,
                       total <= RECORD_LIMIT_S, f"{len(secs)} roles" + "".join(
                           f"; on {c['gpus']} GPUs at once, {c['steps']:.0f} s of steps in {c['span']:.0f} s"
                           for c in calls))]


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


def explain_record(refs) -> list:
    """Per step its seconds, the compiles and captures its file records, and the rest."""
    secs = _record_seconds(refs)
    setup = {r: setup_seconds(refs(r)) for _, r in secs}
    rows = [[f"`{r}`", v, setup[r]["compile"], setup[r]["capture"], v - sum(setup[r].values())] for v, r in secs]
    rows.append(["**all**", *(sum(col) for col in list(zip(*rows))[1:])])
    return table(["step", "seconds", "compiles recorded (s)", "captures recorded (s)", "the rest (s)"], [
        [step, f"{v:.0f}", *(ms(x, 0 if step == "**all**" else 1) if x else None for x in (c, k)), f"{rest:.0f}"]
        for step, v, c, k, rest in rows])


BLOCKS = {"reference-set": part((), reference_set)}
