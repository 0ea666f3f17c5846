"""Does the way ``record`` starts a step move its numbers? One record step's command, run several times in
turn, alternately forked from a forkserver (``record``'s launch) and as a process of its own
(``python -m lfm2vl_lab``), each into empty compile caches as ``record`` runs it, then each run's
spread across rounds and its medians side by side.

A probe beside the reference set: its files never join it. The runs alternate (fork, exec, fork, exec,
...) so that a machine whose host speed drifts over the call moves both launches alike; the host probe
before each run says how fast the host was.

    python scripts/launch_probe.py --role ttft --preset lfm2-vl-450m --runs 4 --out /tmp/launch  # on the H200
    python scripts/launch_probe.py --role ttft --summarize /tmp/launch  # anywhere, from the files
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lfm2vl_lab.measure import record  # noqa: E402
from lfm2vl_lab.measure.launch import Launcher  # noqa: E402

MODES = ("forkserver", "exec")
# The roles whose rows keep every timed sample in round order, and their key; a median that moves by more
# than SPREAD_LIMIT when the last round goes is one a repeat fewer would change.
SAMPLED = {"ttft": "ttft_samples_ms", "request-3b": "ttft_samples_ms", "e2e": "ttft_samples_ms",
           "engine": "prefill_sample_samples_ms"}
SPREAD_LIMIT = 0.02


def round_fewer_move(samples: list[float]) -> float:
    """How far one round fewer moves the median of ``samples`` (in round order), as a fraction."""
    return abs(statistics.median(samples[:-1]) / statistics.median(samples) - 1)


def run_all(argv: list[str], runs: int, out: Path, limit: float, python: str = sys.executable, say=print) -> list[dict]:
    """Run ``python -m lfm2vl_lab <argv>`` ``runs`` times, the launches alternating, each into
    ``out/<k>-<launch>/``; each run's launch, exit status, seconds and host speed (also in ``out/runs.json``)."""
    done = []
    for k in range(runs):
        mode, folder = MODES[k % 2], Path(out) / f"{k + 1}-{MODES[k % 2]}"
        folder.mkdir(parents=True, exist_ok=True)
        done.append({"run": k + 1, "launch": mode, "rc": None, "seconds": None,
                     "host": record.host_speed(python), "folder": folder.name})
        # listed before it starts: a run the device call's limit stops still names its (partial) file
        (Path(out) / "runs.json").write_text(json.dumps({"argv": argv, "runs": done}, indent=1) + "\n")
        t0 = time.perf_counter()
        # a Launcher per run: each forked run pays its forkserver's imports, as a record call's first step does
        with Launcher(python, say, mode=mode) as launch, tempfile.TemporaryDirectory() as caches, \
                (folder / "run.log").open("w") as fh:
            rc = launch.run([*argv, "--out", str(folder)], fh, limit, record.cold_compile_caches(caches))
        done[-1].update(rc=rc, seconds=round(time.perf_counter() - t0, 1))
        say(f"== run {k + 1} ({mode}): exit {rc} in {done[-1]['seconds']} s")
        (Path(out) / "runs.json").write_text(json.dumps({"argv": argv, "runs": done}, indent=1) + "\n")
    return done


def with_presets(argv: list[str], presets: list[str]) -> list[str]:
    """``argv`` with its ``--preset`` options replaced by ``presets`` (a step's command on fewer models, so
    that several runs fit one device call)."""
    kept = [a for i, a in enumerate(argv) if a != "--preset" and (i == 0 or argv[i - 1] != "--preset")]
    return [kept[0], *(a for p in presets for a in ("--preset", p)), *kept[1:]]


def spread(result: dict, key: str) -> dict:
    """What one round fewer would move in a result's sampled rows, and the median of each row, keyed by the
    row's identity."""
    rows = [r for r in result.get("rows") or [] if len(r.get(key) or []) >= 3]
    moves = [round_fewer_move(r[key]) for r in rows]
    medians = {" ".join(str(r.get(f)) for f in ("preset", "image", "requests", "mode")): statistics.median(r[key])
               for r in rows}
    return {"rows": len(rows), "over": sum(m > SPREAD_LIMIT for m in moves), "worst": max(moves, default=0.0),
            "medians": medians}


def summarize(out: Path, key: str, per_row: bool = False) -> list[str]:
    """One line per run (its launch, host, spread), whether the launch moves the medians one way, then the
    rows whose medians differ most between the launches (each launch's median of its runs' medians); with
    ``per_row``, every row's median in every run."""
    meta = json.loads((Path(out) / "runs.json").read_text())
    lines, by_mode, medians = [], {m: [] for m in MODES}, {}
    for run in meta["runs"]:
        files = sorted((Path(out) / run["folder"]).glob("*/*.json"))
        if not files:
            lines.append(f"run {run['run']} ({run['launch']}): no result file (exit {run['rc']})")
            continue
        s = spread(json.loads(files[-1].read_text()), key)
        by_mode[run["launch"]].append(s["medians"])
        medians[run["run"]] = s["medians"]
        python_ms = (run.get("host") or {}).get("python_ms")
        took = "stopped before its end (its rows so far)" if run["rc"] is None else f"{run['seconds']} s"
        lines.append(f"run {run['run']} ({run['launch']}): {took}, host python loop "
                     f"{python_ms if python_ms is None else round(python_ms, 1)} ms, {s['over']} of {s['rows']} rows "
                     f"over {SPREAD_LIMIT:.0%}, worst {s['worst']:.1%}")
    if all(by_mode.values()):
        mid = {m: {row: statistics.median(r[row] for r in runs if row in r) for row in runs[0]}
               for m, runs in by_mode.items()}
        rows = sorted(set(mid["forkserver"]) & set(mid["exec"]),
                      key=lambda row: -abs(mid["forkserver"][row] / mid["exec"][row] - 1))
        lines += bias(by_mode, mid, rows)
        lines.append("rows that differ most, forked against exec (median of each launch's runs, ms):")
        lines += [f"  {row}: {mid['forkserver'][row]:.2f} vs {mid['exec'][row]:.2f} "
                  f"({mid['forkserver'][row] / mid['exec'][row] - 1:+.1%})" for row in rows[:12]]
    if per_row:
        lines.append("each row's median in each run (ms; - where the run has no such row):")
        lines.append("  " + " | ".join(["row", *(f"{r['run']} {r['launch']}" for r in meta["runs"])]))
        runs = [(r, medians[r["run"]]) for r in meta["runs"] if r["run"] in medians]
        for row in sorted({row for _, m in runs for row in m}):
            lines.append("  " + " | ".join([row, *(f"{m[row]:.2f}" if row in m else "-" for _, m in runs)]))
    return lines


def bias(by_mode: dict, mid: dict, rows: list[str]) -> list[str]:
    """Whether the launch moves the numbers one way: how often the forked median is the higher one, and
    how far runs of one launch differ against how far the launches' medians differ (medians over rows)."""
    spans = []  # per row and launch with two runs or more: the largest ratio between its runs, less one
    for runs in by_mode.values():
        for row in rows:
            v = [r[row] for r in runs if row in r]
            if len(v) > 1:
                spans.append(max(v) / min(v) - 1)
    apart = statistics.median(abs(mid["forkserver"][row] / mid["exec"][row] - 1) for row in rows)
    up = sum(mid["forkserver"][row] > mid["exec"][row] for row in rows)
    line = f"forked above exec in {up} of {len(rows)} rows; the launches' medians differ by {apart:.1%}"
    return [line + (f", runs of one launch by {statistics.median(spans):.1%} (medians over rows)" if spans else "")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--role", default="ttft", help="the record step whose command runs (default ttft)")
    ap.add_argument("--runs", type=int, default=4, help="runs in all, the launches alternating (default 4)")
    ap.add_argument("--limit", type=float, default=None, help="seconds per run (default: the step's limit)")
    ap.add_argument("--preset", action="append", default=None,
                    help="run the step's command on this preset only (repeatable; default: the step's own)")
    ap.add_argument("--out", default=None, help="folder for the runs' files")
    ap.add_argument("--summarize", metavar="OUT", default=None, help="only print the summary of an --out folder")
    ap.add_argument("--rows", action="store_true", help="also print every row's median in every run")
    args = ap.parse_args(argv)
    step = next((s for s in record.STEPS if s.role == args.role), None)
    if step is None or step.role not in SAMPLED:
        ap.error(f"--role {args.role}: a role whose rows keep their samples ({', '.join(SAMPLED)})")
    if args.summarize is None:
        if args.out is None:
            ap.error("--out is needed to run (or --summarize OUT to read a run)")
        argv = with_presets(list(step.argv), args.preset) if args.preset else list(step.argv)
        run_all(argv, args.runs, Path(args.out), args.limit or step.limit_s)
    print("\n".join(summarize(Path(args.summarize or args.out), SAMPLED[step.role], args.rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
