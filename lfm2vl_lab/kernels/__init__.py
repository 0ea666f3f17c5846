"""Kernels: the attention and elementwise operations the packed encoder is built from.

A leaf: it imports torch (and Triton, lazily, where a GPU has it) and nothing else of the package;
:mod:`lfm2vl_lab.core` calls it. Read it in this order:

* :mod:`.attention` — attention over packed rows: the two backends ``attention=`` selects
  (``varlen``, ``sdpa_blockmask``; :data:`~.attention.ATTENTION_BACKENDS`) and the choice of one for
  a device (:func:`~.attention.resolve_attention`), the per-item and block-mask forms behind
  ``sdpa_blockmask``, and the batched dense attention of the dense graphs
  (:func:`~.attention.dense_attention`)
* :mod:`.fused` — fewer elementwise kernels in an encoder layer: residual add + LayerNorm as one
  Triton kernel, the MLP's bias + GELU in the GEMM's epilogue; plain torch where they do not apply
* :mod:`.gemv` — the text model's decode linears as a Triton GEMV that streams the weights, with the
  RMSNorm or the MLP's activation before it and the residual add after it taken into the same kernel
* :mod:`.router` — which of the fused text engine's linears run that GEMV, as custom ops that
  torch.compile keeps whole (:class:`~.router.DecodeLinear`)
"""
