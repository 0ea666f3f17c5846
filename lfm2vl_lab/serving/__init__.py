"""Serving: LFM2-VL run the way a serving engine runs it, so the encoder's graphs can be measured in
a whole request.

It may import :mod:`lfm2vl_lab.core`, :mod:`lfm2vl_lab.kernels` and :mod:`lfm2vl_lab.model`, never
the instrument (:mod:`lfm2vl_lab.measure`, which times it). Read it in this order:

* :mod:`.cache` — the hybrid cache allocated once, the shape buckets a request pads to, and the
  checks its inputs pass before any kernel runs
* :mod:`.layers` — LFM2's text layers on that cache, one function per layer kind: what each graph
  captures, unfused, or (the fused engine) compiled by inductor with shared weights
* :mod:`.engine` — ``TextEngine``: LFM2's text model on static buffers and the hybrid cache, with
  prefill, sample and decode captured as CUDA graphs
* :mod:`.pipeline` — ``VlmPipeline``: a request from processor output to greedy tokens in named
  phases (``h2d``, ``encoder``, ``merge``, ``prefill``, ``sample``, ``decode``), each model eager
  (transformers) or graphed (``GraphedEncoder``, ``TextEngine``)
* :mod:`.chat` — text in, text out: one chat turn about images through the pipeline
"""
