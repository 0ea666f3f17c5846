"""The one vLLM release the kit runs, and what it needs beside it: every other place reads these.

Why 0.25.1: it is a release that holds LFM2-VL's ``SupportsEncoderCudaGraph`` (vLLM PR #44930, first
shipped in 0.24.0) *and* pins ``torch==2.11.0``, the torch of the H200 image (2.11.0+cu130), with its
compiled extensions built for CUDA 13. 0.24.0 to 0.26.0 all qualify and carry byte-identical
``lfm2_vl.py``, ``encoder_cudagraph.py`` and ``encoder_cudagraph_defs.py``; 0.27 to 0.29 pin torch
2.13, whose FlashAttention library does not load against 2.11, and 0.33 pins torch 2.14. The CPU
parity layer (``scripts/vllm_venv.sh``) uses the same release, so the helpers the tests compare
against are the code that runs on the GPU.

``WHEELS``: what an offline ``LLM(...)`` run of LFM2-VL imports beyond the H200 image's own packages
(vLLM's other requirements are either there already or never imported on this path: flashinfer,
cutlass-dsl, tilelang, quack, torchcodec, PyNvVideoCodec and the OpenAI server stack). Exact
versions, so the bundle ``scripts/vllm_bundle.py`` builds is the same on every rebuild.

``ENGINE_ENV``: set before vLLM is imported. Without ``VLLM_USE_FLASHINFER_SAMPLER=0`` the sampler
imports flashinfer (not carried) and the engine dies at start; ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``
lets ``LLM.collective_rpc`` send the kit's measuring hooks to vLLM's worker process (a local pipe,
the kit's own functions). ``TVM_FFI_DISABLE_TORCH_C_DLPACK=1``: tvm_ffi (which xgrammar imports)
otherwise tries to compile an optional torch addon at import, in every process, from headers the
bundle leaves out; it is a speed-up for exchanging tensors with TVM, which this path never does.
"""

from __future__ import annotations

VLLM_VERSION = "0.25.1"
VLLM_TORCH = "2.11.0"  # what VLLM_VERSION pins: the H200 image's torch

WHEELS: tuple[tuple[str, str], ...] = (
    ("annotated-types", "0.8.0"),
    ("apache-tvm-ffi", "0.1.15.post2"),  # xgrammar 0.2.9 needs >= 0.1.11
    ("astor", "0.8.1"),
    ("blake3", "1.0.11"),
    ("cachetools", "8.0.2"),
    ("cbor2", "6.3.0"),
    ("depyf", "0.20.0"),
    ("dill", "0.4.1"),
    ("distro", "1.9.0"),
    ("fastapi", "0.136.3"),
    ("httpx2", "2.16.2"),
    ("jiter", "0.19.0"),
    ("llguidance", "1.7.6"),
    ("msgspec", "0.23.0"),
    ("openai", "3.57.0"),
    ("openai-harmony", "0.0.8"),
    ("partial-json-parser", "0.2.1.1.post7"),
    ("pybase64", "1.5.1"),
    ("pydantic", "2.14.4"),
    ("pydantic-core", "2.50.5"),
    ("pyzmq", "27.3.0"),
    ("setproctitle", "1.3.8"),
    ("sniffio", "1.3.1"),
    ("starlette", "1.10.0"),
    ("typing-inspection", "0.4.5"),
    ("xgrammar", "0.2.9"),
)

ENGINE_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
              "TVM_FFI_DISABLE_TORCH_C_DLPACK": "1"}
