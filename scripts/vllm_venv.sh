#!/usr/bin/env bash
# Build .venv-vllm: the kit's vLLM release (VLLM_VERSION in lfm2vl_lab/measure/vllm_release.py, the one
# the H200 runs) layered on top of .venv, for tests/test_vllm_parity.py on a CPU box.
#
# Why not `pip install vllm==VLLM_VERSION`? That pulls vLLM's pinned CUDA torch, flashinfer, cutlass
# and friends: GBs (9.4 with an earlier release), which ran CI out of disk. The parity tests only call
# vLLM's pure Python LFM2-VL helpers, so we reuse .venv's torch/transformers (a .pth file points at
# .venv's site-packages), install vllm itself with --no-deps, and add only its light Python requirements.
# Result: ~0.9 GB, ~1 minute. The price: vLLM runs on .venv's torch, not the one it pins, which does
# not matter for the index/packing/padding helpers we compare against.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || { echo "vllm_venv.sh: .venv is missing; run 'make install' first" >&2; exit 2; }

python3 -m venv .venv-vllm
base_sp=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
vllm_sp=$(.venv-vllm/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$base_sp" > "$vllm_sp/lfm2vl_lab_base.pth"
# The pins, read from the file itself (importing lfm2vl_lab would import torch): the release, and the
# bundle's exact xgrammar and apache-tvm-ffi (xgrammar is imported at module level by the files we test).
pins=$(python3 -c "import runpy; r = runpy.run_path('lfm2vl_lab/measure/vllm_release.py'); w = dict(r['WHEELS'])
print(r['VLLM_VERSION'], 'xgrammar==' + w['xgrammar'], 'apache-tvm-ffi==' + w['apache-tvm-ffi'])")
read -r vllm_version xgrammar_pin tvm_ffi_pin <<<"$pins"

pip=(.venv-vllm/bin/pip install -q --no-cache-dir --disable-pip-version-check)
"${pip[@]}" --no-deps "vllm==$vllm_version"
# vLLM's own requirement list, minus the GPU stacks and what .venv already provides.
.venv-vllm/bin/python - > .venv-vllm/light-requirements.txt <<'PY'
import re
from importlib.metadata import requires
heavy = re.compile(
    r"^(torch|torchaudio|torchvision|torchcodec|transformers|nvidia-|flashinfer|tilelang|quack|tokenspeed|"
    r"humming|PyNvVideoCodec|instanttensor|fastsafetensors|apache-tvm|numba|xgrammar|compressed-tensors|"
    r"opencv|nvtx|mistral_common)", re.I)
for req in requires("vllm"):
    if "extra ==" not in req and not heavy.match(req):
        print(req)
PY
"${pip[@]}" -r .venv-vllm/light-requirements.txt pytest
# Imported at module level by the files we test; their own deps (torch) come from .venv.
"${pip[@]}" --no-deps "$xgrammar_pin" "$tvm_ffi_pin"
.venv-vllm/bin/python -c "import vllm.model_executor.models.lfm2_vl, vllm.v1.worker.encoder_cudagraph, vllm.model_executor.models.lfm2_siglip2"
du -sh .venv-vllm
