"""The budget explorer: what a budget set and an item limit do to the bench's stream of mixed requests,
planned by the manager's own planner (host arithmetic, runs anywhere). The one GPU number, each
budget's graph memory, is read from the reference set, never estimated.

    >>> print(explore_text(explore([64, 128, 256, 512, 1024], max_items=4, per_call=8)))
    >>> budget_explorer()                 # the same, live, as ipywidgets"""

from __future__ import annotations

import html
import re
from collections import Counter
from functools import lru_cache
from pathlib import Path

from ..core.config import GraphOptions, auto_budgets, auto_max_items, check_budgets
from ..core.dense import DenseGraphConfig
from ..core.packing import MIN_ITEM_TOKENS, tokens_for
from ..core.plan import plan_config, plan_stats
from ..measure.results import RESULTS_ROOT
from ..measure.workloads import synthetic_workload
from . import reference

STREAM_N = 24  # requests in the reference set's bench stream (measure/record.py: --stream-n 24, seed 0)
STREAM_PRESET = "lfm2-vl-450m"  # whose processor cuts the images into items (the bench's preset)
MEMORY_ROLE = "bench-450m"  # the reference-set role whose lab-graph rows carry capture_info
DEFAULT_BUDGETS = tuple(auto_budgets(MIN_ITEM_TOKENS, GraphOptions.max_budget))  # the kit's automatic budgets
DEFAULT_MAX_ITEMS = 4  # the widget's start: every other item limit gives this stream another waste
DEFAULT_PER_CALL = 8  # requests per encoder call at the widget's start (24 requests: 3 calls)
NOT_RECORDED = "not recorded"
# Where widgets cannot run (the docs site, nbconvert), the explorer shows its state when displayed (its first,
# in the notebook) under this line.
LIVE_NOTE = ("A picture of the budget explorer: it is live in JupyterLab (make lab), where you edit the budgets and "
             "move the sliders.")


@lru_cache(maxsize=8)
def _stream_tokens(n: int, seed: int, preset: str) -> tuple:
    from ..model.inputs import process_images

    return tuple(tuple(tokens_for(tuple(s)) for s in process_images([r.image()], preset)["spatial_shapes"].tolist())
                 for r in synthetic_workload(n, seed))


def stream_tokens(n: int = STREAM_N, seed: int = 0, preset: str = STREAM_PRESET) -> list[list[int]]:
    """The bench's ``stream`` workload as each request's item tokens (cached: the processor is slow on a CPU)."""
    return [list(t) for t in _stream_tokens(n, seed, preset)]


def calls_of(stream: list[list[int]], per_call: int) -> list[list[int]]:
    """Group consecutive requests into encoder calls of ``per_call`` requests (the last may hold fewer)."""
    if not isinstance(per_call, int) or isinstance(per_call, bool) or per_call < 1:
        raise ValueError(f"per_call must be a positive int (requests per encoder call), got {per_call!r}")
    return [[t for req in stream[i:i + per_call] for t in req] for i in range(0, len(stream), per_call)]


def parse_budgets(text: str) -> list[int]:
    """``"64, 128 256"`` → ``[64, 128, 256]``; a clear ``ValueError`` naming what is not a budget."""
    parts = [p for p in re.split(r"[\s,;]+", str(text).strip().strip("[]()")) if p]
    if not parts:
        raise ValueError(f"no budgets in {text!r}: write token counts such as 64, 128, 256")
    bad = [p for p in parts if not p.isdigit()]
    if bad:
        raise ValueError(f"{bad[0]!r} in {text!r} is not a budget: budgets are positive whole token counts")
    return check_budgets(int(p) for p in parts)


def recorded_memory(role: str = MEMORY_ROLE, gpu: str = reference.REFERENCE_GPU, root=RESULTS_ROOT) -> dict:
    """Per-budget graph memory as the reference set recorded it (the first ``lab-graph`` row of ``role``
    with ``capture_info``); empty where nothing is recorded."""
    res = reference.load(role, gpu, root, required=False)
    rows = [r for r in (res or {}).get("rows", []) if r.get("mode") == "lab-graph" and r.get("capture_info")]
    if not rows:
        return {"by_budget": {}, "label": None, "budgets": [], "run_budget": None}
    row, prov = rows[0], res["provenance"]
    regular = [int(b) for b in row.get("budgets") or []]
    by = {int(c["budget"]): {**c, "run": int(c["budget"]) not in regular}
          for c in row["capture_info"] if "total_mb" in c}
    run = next((b for b, c in by.items() if c["run"]), None)
    label = f"reference set, {role} ({prov.get('gpu')}, {str(prov.get('date', ''))[:10]}, {Path(res['_path']).name})"
    return {"by_budget": by, "label": label, "budgets": regular, "run_budget": run,
            "max_items": row.get("max_items"), "total_mb": sum(c["total_mb"] for c in by.values())}


def replays_per_budget(calls: list[list[int]], config) -> dict[int, int]:
    """Replays per graph budget over ``calls``, planned as :func:`plan_stats` plans them."""
    return dict(sorted(Counter(config.budget_for(sum(toks[i] for i in batch), len(batch))
                               for toks in calls for batch in plan_config(toks, config)[0]).items()))


def explore(budgets=None, max_items: int | None = None, stream: list[list[int]] | None = None,
            per_call: int = 1, max_run_items: int = GraphOptions.max_run_items, memory: dict | None = None,
            gpu: str = reference.REFERENCE_GPU, root=RESULTS_ROOT) -> dict:
    """What ``budgets`` and ``max_items`` (default: automatic) do to ``stream`` (default: the bench's)
    served ``per_call`` requests per call: the config, :func:`plan_stats`, misses (items over the largest
    budget run eagerly), replays per budget, and each graph budget's recorded memory or :data:`NOT_RECORDED`."""
    stream = stream_tokens() if stream is None else stream
    config = DenseGraphConfig.build(out_hidden_size=1, budgets=None if budgets is None else list(budgets),
                                    max_items=max_items, max_run_items=max_run_items)
    calls = calls_of(stream, per_call)
    stats = plan_stats(calls, config)
    memory = recorded_memory(gpu=gpu, root=root) if memory is None else memory
    run = config.run_budget
    mem = {b: row if (row := memory["by_budget"].get(b)) is not None and row["run"] == (b == run) else NOT_RECORDED
           for b in config.graph_budgets}
    return {"budgets": config.budgets, "graph_budgets": config.graph_budgets, "run_budget": run,
            "max_items": config.max_items, "per_call": per_call, "requests": len(stream),
            "items": sum(map(len, stream)), "tokens": sum(map(sum, stream)), "calls": len(calls), **stats,
            "misses": stats["eager_items"],
            "replays_per_budget": replays_per_budget(calls, config), "memory": mem,
            "memory_source": memory}


def _memory_note(res: dict) -> str:
    """Where the graph memory comes from, and whether it was captured in the configuration explored."""
    src = res["memory_source"]
    if not src.get("label"):
        return "graph memory: not recorded (the reference set has no bench-450m lab-graph capture)"
    run = f" + run budget {src['run_budget']}" if src.get("run_budget") else ""
    same = (src["budgets"], src.get("run_budget"), src.get("max_items")) == \
        (res["budgets"], res["run_budget"], res["max_items"])
    return (f"graph memory: {src['label']}\n  captured as budgets {src['budgets']}{run} with max items "
            f"{src.get('max_items')}, largest first into one shared pool: {src['total_mb']:.0f} MiB in all"
            + ("" if same else "\n  (a different configuration: its item slots, and each budget's share of the "
               "pool, would differ)"))


def explore_text(res: dict) -> str:
    """:func:`explore`'s result as a small plain-text table (what the widget shows)."""
    run = f" + run budget {res['run_budget']}" if res["run_budget"] else ""
    per = f"{res['per_call']} request{'' if res['per_call'] == 1 else 's'} per call"
    lines = [f"budgets {res['budgets']}{run}; max items {res['max_items']}; {per}",
             f"stream: {res['requests']} requests, {res['items']} items, {res['tokens']} tokens, "
             f"in {res['calls']} calls",
             f"padding waste {res['waste']:.1%} ({res['padded']} padded tokens), {res['replays']} replays, "
             f"{res['misses']} miss{'' if res['misses'] == 1 else 'es'} "
             f"(items over {max(res['budgets'])} tokens, run eagerly)",
             f"{'budget':>10}{'replays':>9}  graph memory (MiB, recorded)"]
    for b in res["graph_budgets"]:
        m = res["memory"][b]
        mem = m if isinstance(m, str) else \
            f"{m['total_mb']:.1f} (pool {m['pool_mb']:.1f} + buffers {m['buffers_mb']:.1f})"
        name = f"{b} run" if b == res["run_budget"] else str(b)
        lines.append(f"{name:>10}{res['replays_per_budget'].get(b, 0):>9}  {mem}")
    return "\n".join(lines + [_memory_note(res)])


class BudgetExplorer:
    """The explorer as ipywidgets (budgets box, requests-per-call and max-items sliders, an HTML output
    re-rendered on every change); ``text`` is what the output shows."""

    def __init__(self, stream=None, budgets=DEFAULT_BUDGETS, max_items: int = DEFAULT_MAX_ITEMS,
                 per_call: int = DEFAULT_PER_CALL, memory: dict | None = None):
        try:
            import ipywidgets as w
        except ImportError as exc:
            raise ImportError("budget_explorer needs ipywidgets (pip install ipywidgets); explore() and "
                              "explore_text() work without it") from exc
        self.stream = stream_tokens() if stream is None else stream
        self.memory = recorded_memory() if memory is None else memory
        budgets = check_budgets(budgets)
        wide = {"description_width": "initial"}
        self.budgets = w.Text(value=", ".join(map(str, budgets)), description="budgets", continuous_update=False,
                              style=wide)
        self.per_call = w.IntSlider(value=min(per_call, len(self.stream)), min=1, max=len(self.stream),
                                    description="requests per call", style=wide)
        top = auto_max_items(budgets, MIN_ITEM_TOKENS)
        self.max_items = w.IntSlider(value=min(max_items, top), min=1, max=top, description="max items", style=wide)
        self.output = w.HTML()
        self.ui = w.VBox([self.budgets, self.per_call, self.max_items, self.output])
        self.text = ""
        self._busy = False
        for control in (self.budgets, self.per_call, self.max_items):
            control.observe(self._update, names="value")
        self._update()

    def _update(self, change=None) -> None:
        if self._busy:  # changing the slider's range below moves its value: one render is enough
            return
        self._busy = True
        try:
            budgets = parse_budgets(self.budgets.value)
            top = auto_max_items(budgets, MIN_ITEM_TOKENS)
            if self.max_items.max != top:
                self.max_items.max = top
            res = explore(budgets, self.max_items.value, self.stream, self.per_call.value, memory=self.memory)
            self.text = explore_text(res)
        except ValueError as exc:
            self.text = f"budgets: {exc}"
        finally:
            self._busy = False
        self.output.value = f"<pre>{html.escape(self.text)}</pre>"

    def _repr_mimebundle_(self, **kwargs):
        # The widget for JupyterLab (it ranks the widget view first), and beside it the state the explorer
        # is displayed in, under LIVE_NOTE, as HTML and text: what nbconvert, the docs site and a
        # kernel-less viewer show instead of ipywidgets' "VBox(children=...)".
        bundle = self.ui._repr_mimebundle_(**kwargs)
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        data.update({"text/html": f'<div class="lab-static-widget"><p><em>{html.escape(LIVE_NOTE)}</em></p>'
                                  f"<pre>{html.escape(self.text)}</pre></div>",
                     "text/plain": f"{LIVE_NOTE}\n{self.text}"})
        return bundle


def budget_explorer(stream=None, budgets=DEFAULT_BUDGETS, max_items: int = DEFAULT_MAX_ITEMS,
                    per_call: int = DEFAULT_PER_CALL, memory: dict | None = None) -> BudgetExplorer:
    """The interactive explorer (needs ipywidgets); display it as a cell's last expression."""
    return BudgetExplorer(stream, budgets, max_items, per_call, memory)
