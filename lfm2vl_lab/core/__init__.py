"""The technique, and only it: LFM2-VL's vision encoder made CUDA-graph capturable, then captured
and replayed, in the shape of vLLM's ``encoder_cudagraph.py`` plus the LFM2-VL half of ``lfm2_vl.py``.

Imports torch and transformers (plus numpy and PIL, which transformers' image processor needs) and
:mod:`lfm2vl_lab.kernels`, which the encoder calls; never the other packages. Read it top to bottom:

* :mod:`.packing`  — processor output → packed varlen layout (``cu_seqlens``, ``gather_idx``, the
  position cache), and the processor's limits as the model carries them
* :mod:`.protocol` — the contract: ``EncoderGraphModel`` (what a model provides) and ``GraphConfig``
  (the budgets, item limit, named buffers and padding logics ``fn(dst, src)`` the manager reads)
* :mod:`.config`   — ``GraphOptions`` (every setting, one default and one check each); LFM2-VL's
  graph config, derived from them once
* :mod:`.encoder`  — the packed split-forward encoder on transformers' own weights
* :mod:`.capture`  — one capture recipe, and recovery after a failed capture
* :mod:`.guard`    — the weight stamp: what the graphs read, and how a change is noticed
* :mod:`.ptrcheck` — the stamp's per-call pointer check: torch's, or a small C++ one built on request
* :mod:`.lifecycle` — one set of graphs' life: pool, stamp, all-or-nothing capture, recapture
* :mod:`.serial`   — one caller at a time: the lock, the hand-over between streams, requests
* :mod:`.plan`     — which items replay together, and what that costs (pure host logic)
* :mod:`.manager`  — the generic manager: plans, captures, fills the named buffers, replays
* :mod:`.lfm2vl`   — LFM2-VL's side of the protocol: one varlen graph per budget; ``Variant``
* :mod:`.staging`  — optimisations of the input path: staged pixel rows, cached batch layouts
* :mod:`.dense`    — an optimisation on top: dense graph variants and the run budget
* :mod:`.graphed_encoder` — ``GraphedEncoder``: a manager given LFM2-VL's side, and its plug
  into transformers' ``forward``/``generate``
"""
