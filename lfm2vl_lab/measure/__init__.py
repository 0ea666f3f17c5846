"""The measuring instrument: timing, profiling, workloads and modes, the benchmark, the correctness check,
end-to-end TTFT and whole requests, the text engine's peers, vLLM driven from outside, results with
provenance, and the reference run (``record``). It runs the technique; nothing in the technique imports it.
"""
