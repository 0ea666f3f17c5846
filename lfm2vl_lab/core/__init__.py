"""The technique: LFM2-VL's vision encoder made CUDA-graph capturable, then captured and replayed.

Imports only torch and transformers (plus numpy and PIL, which transformers' image processor
already needs); never :mod:`lfm2vl_lab.tools`. Read it top to bottom in this order:

* :mod:`.presets`  — model shapes as data, random-weight models, local checkpoints
* :mod:`.inputs`   — any image → RGB → transformers' real LFM2-VL image processor
* :mod:`.packing`  — processor output → packed varlen layout (cu_seqlens, gather_idx, …)
* :mod:`.encoder`  — the packed split-forward encoder on transformers' own weights
* :mod:`.config`   — graph config: budgets, item limit, padding logics ``fn(dst, src)``
* :mod:`.capture`  — one capture recipe, and recovery after a failed capture
* :mod:`.graphs`   — planning, the protocol a model implements, the generic manager, ``GraphedEncoder``
* :mod:`.hf`       — transformers' own image path, and the plug that swaps ours in
* :mod:`.parity`   — error measures and the float32 judge
* :mod:`.engine`, :mod:`.pipeline` — the text model on static buffers; a request in phases
* :mod:`.chat`     — text in, text out: one chat turn through the pipeline (:mod:`.toy_processor`:
  a stand-in tokenizer for random-weight models)
"""
