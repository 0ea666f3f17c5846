"""The technique, and only it: LFM2-VL's vision encoder made CUDA-graph capturable, then captured
and replayed, in the shape of vLLM's ``encoder_cudagraph.py`` plus the LFM2-VL half of ``lfm2_vl.py``.

Imports torch and transformers (plus numpy and PIL, which transformers' image processor needs) and
:mod:`lfm2vl_lab.kernels`, which the encoder calls; never the other packages. Read it top to bottom:

* :mod:`.packing`  — processor output → packed varlen layout (``cu_seqlens``, ``gather_idx``, the
  position cache), and the processor's limits as the model carries them
* :mod:`.config`   — ``GraphOptions`` (every setting, one default each); the graph config: budgets,
  item limit, the named buffers and their padding logics ``fn(dst, src)``
* :mod:`.encoder`  — the packed split-forward encoder on transformers' own weights
* :mod:`.capture`  — one capture recipe, and recovery after a failed capture
* :mod:`.guard`    — the weight stamp: what the graphs read, and how a change is noticed
* :mod:`.ptrcheck` — the stamp's per-call pointer check: torch's, or a small C++ one built on request
* :mod:`.serial`   — one caller at a time: the lock, the hand-over between streams, requests
* :mod:`.plan`     — which items replay together, and what that costs (pure host logic)
* :mod:`.manager`  — the protocol a model implements, and the generic manager
* :mod:`.lfm2vl`   — LFM2-VL's side of the protocol: one varlen graph per budget
* :mod:`.staging`  — optimisations of the input path: staged pixel rows, cached batch layouts
* :mod:`.dense`    — an optimisation on top: dense graph variants and the run budget
* :mod:`.graphed_encoder` — ``GraphedEncoder``: the manager given LFM2-VL's side, and its plug
  into transformers' ``forward``/``generate``
"""
