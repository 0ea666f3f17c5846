"""vLLM itself, driven the way the kit measures it: engines per arm, requests, and hooks in its worker.

Imported only where vLLM is installed (:mod:`.vllm_release` pins the release); everything that
needs no vLLM (the arms' settings, the statistics) lives in :mod:`.vllm_ab` and is tested on a CPU.

An *arm* is one engine: ``off`` (encoder CUDA graphs off: vLLM's default), ``pr`` (the graph config
vLLM PR #44930 was measured with) or ``kit`` (the kit's automatic budgets and item limit, written
out). Everything else is vLLM's default engine, so the text model is compiled and runs under vLLM's
own CUDA graphs in every arm, as in the PR's measurement, with three additions that change no
kernel: ``disable_log_stats=False`` (requests carry vLLM's own timestamps), ``logprobs_mode=
"raw_logits"`` (a parity request gets the raw logits of its top tokens) and
``enable_mm_processor_stats`` (vLLM times its own processor). That last switch also makes vLLM's
worker synchronise the GPU around each encoder call; :func:`install_hooks` switches that part off in
the worker again, so no arm pays for a sync its users would not, and times the encoder with CUDA
events instead.

Hooks run *inside* vLLM's worker process, sent there with ``LLM.collective_rpc`` (which needs
``VLLM_ALLOW_INSECURE_SERIALIZATION=1``: :data:`.vllm_release.ENGINE_ENV`); they are module-level
functions so that the worker imports them from this module by name.
"""

from __future__ import annotations

import time

import torch

from .meter import pool_bytes

ENCODER_LOG = "_lab_encoder_log"  # the worker's list of (start, end, host_s, items) per encoder call


# --------------------------------------------------------------------------------------------
# In vLLM's worker process
# --------------------------------------------------------------------------------------------


def install_hooks(worker) -> dict:
    """Time every call of the model runner's encoder step with CUDA events (no sync), and stop the
    worker's own timing (which synchronises). Returns what the worker runs: its encoder graph
    manager's budgets and item limit (None without one)."""
    runner = worker.model_runner
    if getattr(runner, "observability_config", None) is not None:
        runner.observability_config.enable_mm_processor_stats = False
    step = type(runner)._execute_mm_encoder
    log: list = []

    def timed(scheduler_output, *args, **kwargs):
        items = sum(len(v) for v in (scheduler_output.scheduled_encoder_inputs or {}).values())
        if not items:
            return step(runner, scheduler_output, *args, **kwargs)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        out = step(runner, scheduler_output, *args, **kwargs)
        end.record()
        log.append((start, end, time.perf_counter() - t0, items))
        return out

    runner._execute_mm_encoder = timed
    setattr(runner, ENCODER_LOG, log)
    mgr = runner.encoder_cudagraph_manager
    return {"budgets": list(mgr.token_budgets), "max_items": int(mgr.max_batch_size)} if mgr is not None else {}


def read_hooks(worker) -> dict:
    """The encoder calls since the last read (GPU ms on the stream, host ms, items each), and the
    encoder graph manager's cumulative hits and misses; empties the log."""
    runner = worker.model_runner
    log = getattr(runner, ENCODER_LOG)
    torch.cuda.synchronize()
    calls = [{"gpu_ms": s.elapsed_time(e), "host_ms": 1e3 * h, "items": n} for s, e, h, n in log]
    log.clear()
    mgr = runner.encoder_cudagraph_manager
    stats = mgr.get_cumulative_stats() if mgr is not None else None
    return {"calls": calls, "graph_stats": {k: stats[k] for k in ("graph_hits", "graph_misses")} if stats else None}


def measure_encoder_capture(worker) -> dict:
    """Capture vLLM's encoder graphs once more, the way its own start-up profiling does (a fresh
    manager from the runner's config into a pool of its own), timed, with the memory it took; then
    release them. None-valued where the engine has no encoder graphs. Memory is read three ways:
    the segments of the capture's own pool (``pool_mib``, the kit's ``pool_bytes``: what the graphs
    keep, whatever the allocator held before), the growth of the allocator's reserved bytes
    (``reserved_mib``) and of the device's used memory (``device_mib``). The last two stay at 0 when
    the capture fits in blocks the allocator already held, as they did in every engine of the first
    recorded run; files from before ``reserved_mib`` hold only the device read, as ``memory_mib``."""
    runner = worker.model_runner
    mgr = runner._create_encoder_cudagraph_manager()
    if mgr is None:
        return {"graphs": 0, "capture_s": None, "pool_mib": None, "reserved_mib": None, "device_mib": None}
    from vllm.platforms import current_platform

    torch.cuda.synchronize()
    free0, reserved0 = torch.cuda.mem_get_info()[0], torch.cuda.memory_reserved()
    t0 = time.perf_counter()
    pool = current_platform.graph_pool_handle()
    mgr.capture(graph_pool=pool)
    torch.cuda.synchronize()
    took = time.perf_counter() - t0
    reserved, device = torch.cuda.memory_reserved() - reserved0, free0 - torch.cuda.mem_get_info()[0]
    held = pool_bytes(torch.cuda.memory_snapshot(), pool)
    graphs = mgr.get_num_graphs_to_capture()
    mgr.clear()
    del mgr
    torch.cuda.empty_cache()
    return {"graphs": graphs, "capture_s": round(took, 3), "pool_mib": round(held / 2**20, 1),
            "reserved_mib": round(max(reserved, 0) / 2**20, 1), "device_mib": round(max(device, 0) / 2**20, 1)}


# --------------------------------------------------------------------------------------------
# In the kit's process
# --------------------------------------------------------------------------------------------


def start_engine(folder, compilation_config: dict, memory_fraction: float, max_model_len: int):
    """One vLLM engine on ``folder`` (the kit's model folder: its config, weights, processor), with
    :func:`install_hooks` in its worker. Returns ``(llm, start_s, worker_info)``."""
    from vllm import LLM

    t0 = time.perf_counter()
    llm = LLM(model=str(folder), tokenizer=str(folder), dtype="bfloat16", seed=0, max_model_len=max_model_len,
              gpu_memory_utilization=memory_fraction, limit_mm_per_prompt={"image": 1},
              compilation_config=compilation_config, disable_log_stats=False, logprobs_mode="raw_logits",
              enable_mm_processor_stats=True)
    start_s = time.perf_counter() - t0
    info = llm.collective_rpc(install_hooks)[0]
    return llm, start_s, info


def sampling(max_tokens: int, logprobs: int | None = None):
    """Greedy, exactly ``max_tokens`` tokens (random weights may pick the end token early, and every
    arm must decode as many steps)."""
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=logprobs)


def _processor_ms(llm) -> list[float]:
    """vLLM's own processor timing (ms, its ``preprocessor_total_secs``) of each multimodal prompt it
    rendered since the last read, in the order it rendered them (empty where vLLM keeps none). Its keys
    count up per prompt (``renderer0-mm-<k>``), not by request id, so the order is what ties a time to
    a request: the kit sends one batch at a time."""
    try:
        stats = llm.llm_engine.renderer._mm_timing_registry.stat()
    except AttributeError:
        return []

    def counter(key: str) -> int:
        tail = key.rsplit("-", 1)[-1]
        return int(tail) if tail.isdigit() else -1

    return [1e3 * stats[k].get("preprocessor_total_secs", 0.0) for k in sorted(stats, key=counter)]


def run_batch(llm, prompt: str, images: list, max_tokens: int, logprobs: int | None = None) -> dict:
    """One ``llm.generate`` of ``len(images)`` requests (one image each, the same prompt text), timed
    on the host, with what vLLM says of each request and what the worker's hooks saw."""
    params = sampling(max_tokens, logprobs)
    reqs = [{"prompt": prompt, "multi_modal_data": {"image": im}} for im in images]
    t0 = time.perf_counter()
    outs = llm.generate(reqs, params, use_tqdm=False)
    wall_ms = 1e3 * (time.perf_counter() - t0)
    hooks = llm.collective_rpc(read_hooks)[0]
    proc = _processor_ms(llm)
    proc = proc if len(proc) == len(outs) else [None] * len(outs)
    per = []
    for o, proc_ms in zip(outs, proc):
        m = o.metrics
        per.append({"ttft_ms": 1e3 * m.first_token_latency if m else None,
                    "queue_ms": 1e3 * (m.scheduled_ts - m.queued_ts) if m else None,
                    "scheduled_to_first_ms": 1e3 * (m.first_token_ts - m.scheduled_ts) if m else None,
                    "processor_ms": proc_ms,
                    "prompt_len": len(o.prompt_token_ids), "tokens": list(o.outputs[0].token_ids),
                    "prompt_token_ids": list(o.prompt_token_ids)})
        if logprobs:
            per[-1]["first_logits"] = {int(t): float(lp.logprob) for t, lp in o.outputs[0].logprobs[0].items()}
    return {"wall_ms": wall_ms, "requests": per, "encoder": hooks["calls"], "graph_stats": hooks["graph_stats"]}


def encoder_capture(llm) -> dict:
    """:func:`measure_encoder_capture` in the engine's worker."""
    return llm.collective_rpc(measure_encoder_capture)[0]
