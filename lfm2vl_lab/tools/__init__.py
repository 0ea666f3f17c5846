"""The measuring instrument, beside the technique in :mod:`lfm2vl_lab.core` and never inside it:
timing, workloads, modes, the benchmark, tables, profiling, results with provenance, plots, the
correctness check, end-to-end TTFT, the attention probe, the notebooks' shared helpers and the CLI.
"""
