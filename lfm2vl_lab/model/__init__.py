"""The model: LFM2-VL built or loaded through transformers, its inputs, and transformers' own image
path as the reference.

It may import :mod:`lfm2vl_lab.core` and :mod:`lfm2vl_lab.kernels` (the processor's limits and the
encoder's view of the model's parts), never :mod:`lfm2vl_lab.serving` or the instrument. Read it in
this order:

* :mod:`.presets` — model shapes as data (``data/presets/``), random-weight models
  (:func:`~.presets.build_model`), local checkpoints (:func:`~.presets.load_model`,
  ``LFM2VL_CHECKPOINT``)
* :mod:`.inputs` — any image → RGB → transformers' real ``Lfm2VlImageProcessor``
  (:func:`~.inputs.process_images`: what ``GraphedEncoder.encode`` takes)
* :mod:`.hf` — transformers' own ``get_image_features``, the reference every packed or graphed output
  is judged against
* :mod:`.parity` — error measures, and the float32 judge for bf16/fp16 outputs
* :mod:`.toy_processor` — a stand-in tokenizer and chat template for random-weight models, so that
  :func:`lfm2vl_lab.serving.chat.chat` runs on a preset
* :mod:`.folder` — a model in memory written as a checkpoint folder in a real one's layout
  (:func:`~.folder.write_model_folder`), which vLLM, transformers and :func:`~.presets.load_model` all load
"""
