"""The pages' parts about the record itself: the manifest (``reference-set``), what a re-record costs
after a change (``record-cost``), and the goal that a full record of the kit's own roles fits in
:data:`RECORD_LIMIT_S` seconds, with where its seconds go (:func:`explain_record`)."""

from __future__ import annotations

import statistics
from datetime import datetime, timedelta

from .frames import Refs, ms, pct, table
from .reference import manifest_path


def reference_block(refs: Refs) -> str:
    """The manifest: when and from which code the run was recorded, and each role's file."""
    man = refs.manifest
    code = {role: e.get("code_hash", man["code_hash"]) for role, e in man["files"].items()}
    rows = [[f"`{role}`", f"`{e['file']}`", e.get("part"), e.get("rc"), ms(e.get("seconds"), 0),
             f"`{code[role][7:19]}`"] for role, e in man["files"].items()]
    prov = refs(next(iter(man["files"])))["provenance"]
    failed = ", ".join(man.get("failed") or {}) or "none"
    versions = sorted(set(code.values()), key=list(code.values()).index)
    return "\n\n".join([
        f"`{man['command']}` on one {man['gpu']}, {man['started'][:16].replace('T', ' ')} to "
        f"{str(man['finished'])[:16].replace('T', ' ')} UTC; "
        + (f"code `{versions[0][:19]}…`; " if len(versions) == 1 else
           f"{len(versions)} code versions, each role's in the table (each recoverable from the commit that "
           f"recorded it); ")
        + f"{'complete' if man['complete'] else 'incomplete'}, failed steps: {failed}. torch {prov.get('torch')}, "
        f"CUDA {prov.get('cuda')}, transformers {prov.get('transformers')}, Python {prov.get('python')}.",
        table(["role", "file", "part", "exit status", "seconds", "code"], rows),
        f"Manifest: `{refs.shown(manifest_path(refs.gpu, refs.root))}`."])


def _beside_seconds(man: dict, step) -> str:
    """A role beside the set's seconds: the sum over the calls a resumable step took (``calls``), or,
    where its entry predates ``calls``, its last call's seconds, said to be only that."""
    entry = man["files"][step.role]
    calls = entry.get("calls")
    if calls:
        return f"{entry['seconds']:.0f} ({len(calls)} calls: " + " + ".join(f"{c:.0f}" for c in calls) + ")"
    if step.resumable:
        return f"{entry['seconds']:.0f} (its last call only: this manifest does not sum a resumed step's calls)"
    return f"{entry['seconds']:.0f}"


def record_cost_block(refs: Refs) -> str:
    """What a re-record costs: every role, then what `record --changed` re-runs after a change to each
    group of files (the files that move the same roles), with the seconds those roles took in the set."""
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
    rows += [[f"`{s.role}` (beside the set, timed apart)", f"`record --part {s.part}`", _beside_seconds(man, s)]
             for s in recorded if s.beside]
    # a resumed role whose entry holds only its last call's seconds: a sum with it is a lower bound
    last_only = {s.role for s in recorded if s.resumable and not man["files"][s.role].get("calls")}
    for roles, files in sorted(groups.items(), key=lambda kv: (-sum(seconds[r] for r in kv[0]), kv[1])):
        shown = ", ".join(f"`{f.removeprefix('lfm2vl_lab/')}`" for f in files[:6])
        rows.append([shown + (f" and {len(files) - 6} more" if len(files) > 6 else ""),
                     "all" if len(roles) == len(recorded) else ", ".join(f"`{r}`" for r in roles),
                     ("≥ " if last_only & set(roles) else "") + f"{sum(seconds[r] for r in roles):.0f}"])
    return "\n\n".join([
        table(["a change to", "re-records", "seconds of steps"], rows),
        "Seconds of steps: what each role's step took when the set was recorded (the manifest's `seconds`), "
        "summed; a call adds the machine's start and the copy of the tree; ≥: the sum holds a resumed role's last "
        "call only. Which roles a file moves is the "
        "import closure of each role's command (`lfm2vl_lab.measure.role_code`); a file in no row (a table, a "
        "figure, the site) moves none.", f"Manifest: `{refs.shown(manifest_path(refs.gpu, refs.root))}`."])


RECORD_LIMIT_S = 600  # a full record of the kit's own roles fits in a third of a session's device time


def _record_seconds(refs: Refs) -> list[tuple[float, str]]:
    """``(seconds, role)`` of each of the kit's own steps in the manifest (vLLM's is timed apart), longest first."""
    from ..measure.record import STEPS

    files = refs.manifest["files"]
    return sorted(((files[s.role].get("seconds") or 0, s.role) for s in STEPS if s.role in files and not s.beside),
                  reverse=True)


def device_seconds(entries: list[dict]) -> tuple[float, list[dict]]:
    """The device seconds the manifest ``entries`` cost, and the calls among them that ran on several
    GPUs (``gpus``, the ``steps``' seconds summed, their ``span``). An entry costs its ``seconds``, but
    the steps of a call on several GPUs (``gpus`` > 1) ran at once: the call costs its span, from its
    first step's start (an entry's ``date`` less its seconds in that call) to its last step's end."""
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


def _on_several_gpus(calls: list[dict]) -> str:
    return "".join(f"; on {c['gpus']} GPUs at once, {c['steps']:.0f} s of steps in {c['span']:.0f} s" for c in calls)


def record_goals(refs: Refs) -> list[dict]:
    """A full ``record`` of the kit's own roles spends at most :data:`RECORD_LIMIT_S` s of the device's
    time in its steps (:func:`device_seconds`)."""
    secs = _record_seconds(refs)
    total, calls = device_seconds([refs.manifest["files"][r] for _, r in secs])
    return [{"target": "a full record of the kit's own roles, steps in s", "limit": RECORD_LIMIT_S,
             "value": total, "ok": total <= RECORD_LIMIT_S, "detail": f"{len(secs)} roles" + _on_several_gpus(calls)}]


def record_how(refs: Refs) -> str:
    """How :func:`record_goals` counts, for the line under its table."""
    calls = device_seconds([refs.manifest["files"][r] for _, r in _record_seconds(refs)])[1]
    return " (the manifest's seconds of each step, summed" + (
        "; a call that ran on several GPUs counts its span, not its steps' sum" + _on_several_gpus(calls)
        if calls else "") + ")"


# The set-up the files record, by key: first compiles (torch.compile's modes, the fused text engine) and
# graph captures. A bench row's ``capture_info`` splits its ``capture_s`` by budget, so it is not walked;
# rows of one capture repeat its value, so each distinct value counts once.
SETUP_KEYS = {"compile_s": "compile", "compile_first_call_s": "compile", "capture_s": "capture"}


def setup_seconds(res: dict) -> dict[str, float]:
    """``{"compile": s, "capture": s}``: the distinct set-up seconds a result file records."""
    seen: dict[str, set] = {"compile": set(), "capture": set()}

    def walk(o) -> None:
        if isinstance(o, dict):
            for k, v in o.items():
                if k in SETUP_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool):
                    seen[SETUP_KEYS[k]].add(v)
                elif k != "capture_info":
                    walk(v)
        elif isinstance(o, list):
            for x in o:
                walk(x)

    walk(res)
    return {k: sum(v) for k, v in seen.items()}


def explain_record(refs: Refs) -> str:
    """Where a full record's seconds go: the five longest steps, which of them compile before they time,
    and per step the compiles and captures its file records (the rest the files do not split)."""
    from ..measure.record import STEPS

    argv = {s.role: " ".join(s.argv) for s in STEPS}
    secs = _record_seconds(refs)
    total, top = sum(v for v, _ in secs), secs[:5]
    compiling = [r for _, r in top if "compile" in argv[r] or "--fuse" in argv[r]]  # torch.compile, fused engine
    setup = {r: setup_seconds(refs(r)) for _, r in secs}
    comp, cap = (sum(s[k] for s in setup.values()) for k in ("compile", "capture"))
    rows = [[f"`{r}`", f"{v:.0f}", ms(setup[r]["compile"], 1) if setup[r]["compile"] else None,
             ms(setup[r]["capture"], 1) if setup[r]["capture"] else None,
             f"{v - setup[r]['compile'] - setup[r]['capture']:.0f}"] for v, r in secs]
    calls = device_seconds([refs.manifest["files"][r] for _, r in secs])[1]
    return "\n\n".join([
        f"The {len(secs)} steps took {total:.0f} s" + "".join(
            f"; {c['steps']:.0f} s of them ran on {c['gpus']} GPUs at once, in {c['span']:.0f} s" for c in calls)
        + f". The five longest hold {sum(v for v, _ in top) / total:.0%} of it: "
        + ", ".join(f"`{r}` {v:.0f} s" for v, r in top) + ". Of those, "
        + (", ".join(f"`{r}`" for r in compiling) or "none")
        + " compile before they time (a `torch.compile` mode or the fused text engine, in fresh processes). "
        f"The files record {comp:.0f} s of first compiles and {cap:.0f} s of graph captures; the other "
        f"{total - comp - cap:.0f} s are each process's start, model builds, warm-up, transformers' reference paths "
        "and the timed calls, which the files do not split (`scripts/step_profile.py` splits one step's seconds "
        "under cProfile).",
        table(["step", "seconds", "compiles recorded (s)", "captures recorded (s)", "the rest (s)"], rows),
        _launch_text(refs, comp),
        repeat_spread_text(refs),
        "A change touches fewer roles: `record --changed` re-runs only those (docs/gpu.md gives each group's "
        "seconds)."])


def _launch_text(refs: Refs, compiles: float) -> str:
    """How the steps were started and compiled (the manifest's ``launch``, ``forkserver_s`` and
    ``compile_cache``), and what the recorded first compiles leave of the limit."""
    entries = [refs.manifest["files"][r] for _, r in _record_seconds(refs)]
    forked = [e for e in entries if e.get("launch") == "forkserver"]
    cold = sum(e.get("compile_cache") == "empty" for e in entries)
    imports = sum(e.get("forkserver_s") or 0 for e in forked)
    every = len(forked) == len(entries)
    started = ((f"All {len(entries)} steps were" if every else f"{len(forked)} of the {len(entries)} steps were")
               + " forked from a forkserver that imports torch, transformers and the kit once per call "
               f"({imports:.0f} s of imports in all, counted in each call's first step)"
               + ("" if every else ", the others each started as a process of its own") if forked else
               f"Each of the {len(entries)} steps started as a process of its own, imports and all")
    caches = (("all" if cold == len(entries) else str(cold)) + " compiled into empty caches of their own, so their "
              "first compiles are cold" + ("" if cold == len(entries) else ", the others on the machine's shared "
                                           "caches") if cold else "all compiled on the machine's shared caches, "
              "so a first compile may have found what an earlier step compiled")
    return (f"{started}; {caches}. The recorded first compiles alone take {compiles:.0f} s, "
            f"{compiles / RECORD_LIMIT_S:.0%} of the {RECORD_LIMIT_S} s aimed for.")


# The roles whose rows keep every timed sample, in round order, and the key of the samples; a median that
# moves by more than SPREAD_LIMIT when the last round goes would change what the pages say of it.
SAMPLED = {"ttft": "ttft_samples_ms", "request-3b": "ttft_samples_ms", "e2e": "ttft_samples_ms",
           "engine": "prefill_sample_samples_ms"}
SPREAD_LIMIT = 0.02


def round_fewer_move(samples: list[float]) -> float:
    """How far one round fewer moves the median of ``samples`` (in round order): the median of all but
    the last, against the median of all, as a fraction."""
    return abs(statistics.median(samples[:-1]) / statistics.median(samples) - 1)


def repeat_spread(refs: Refs) -> list[dict]:
    """Per sampled role: what one repeat fewer would have recorded. The samples are in round order
    (``time_paired``), so the first ``n - 1`` of them are a run with one round fewer; each row's median
    from those is held against its median from all ``n``."""
    out = []
    for role, key in SAMPLED.items():
        if role not in refs.manifest["files"]:
            continue
        samples = [r[key] for r in refs(role).get("rows") or [] if len(r.get(key) or []) >= 3]
        if not samples:
            continue
        moves = [round_fewer_move(s) for s in samples]
        out.append({"role": role, "repeats": len(samples[0]), "rows": len(moves), "worst": max(moves),
                    "over": sum(m > SPREAD_LIMIT for m in moves)})
    return out


def repeat_spread_text(refs: Refs) -> str:
    """Whether the spread allows fewer repeats: :func:`repeat_spread` as a table and a verdict."""
    spread = repeat_spread(refs)
    if not spread:
        return "No role of this set keeps its timed samples, so its spread cannot say whether fewer repeats would do."
    rows = [[f"`{s['role']}`", s["repeats"], pct(s["worst"]), f"{s['over']} of {s['rows']}",
             "no" if s["over"] else "yes"] for s in spread]
    allowed = [f"`{s['role']}`" for s in spread if not s["over"]]
    timed, steps = _bench_timed_seconds(refs)
    return "\n\n".join([
        f"Fewer repeats, where the spread allows: each row's median from all its rounds, against the median "
        f"without the last round (what one repeat fewer would have recorded). A cut is allowed where no row's "
        f"median moves by more than {pct(SPREAD_LIMIT, 0)}.",
        table(["step", "repeats", "largest move of a median", "rows over the limit", "one repeat fewer allowed"],
              rows),
        ("The spread allows one repeat fewer in " + ", ".join(allowed) + "." if allowed else
         "The spread allows no cut: in every sampled step, one repeat fewer moves some median by more than the "
         "limit.")
        + (f" The benches keep percentiles, not samples; their timed calls take about {timed:.0f} s of their "
           f"{steps:.0f} s (each row's median × its repeats and warm-up calls, summed: composed), so fewer repeats "
           "would save at most that." if steps else "")])


def _bench_timed_seconds(refs: Refs) -> tuple[float, float]:
    """The benches' timed calls, composed from their rows (median × (repeats + warm-up)), and their
    steps' seconds."""
    timed = steps = 0.0
    for seconds, role in _record_seconds(refs):
        rows = refs(role).get("rows") or []
        if rows and all("median_ms" in r and "repeats" in r for r in rows):
            timed += sum(r["median_ms"] * (r["repeats"] + r.get("warmup", 0)) for r in rows) / 1e3
            steps += seconds
    return timed, steps


BLOCKS = {"reference-set": reference_block, "record-cost": record_cost_block}
