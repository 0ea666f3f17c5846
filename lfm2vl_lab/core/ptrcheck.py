"""The weight stamp's pointer check (:class:`~.guard.WeightStamp`): torch's function, or the kit's
small C++ extension once it is built.

Both answer one question before every ``encode`` and every text-engine call: does every tensor the
graphs read still have the storage pointer it had at capture? Same comparison, same answer:

* ``"torch"``: ``torch._C._tensors_data_ptrs_at_indices_equal`` (what inductor's CUDA-graph trees
  use). Always there. Its loop is C++, but pybind converts its Python lists of tensors, pointers and
  indices element by element on every call, and that is most of its cost.
* ``"extension"``: ``PointerCheck`` from ``ptrcheck.cpp`` beside this file, a plain CPython type
  (no pybind11 call dispatch on every call). It takes the tensors, their
  pointers and the parts' module lists once, when the stamp is armed, and its call takes no
  arguments: per list, its dictionary's identity and length; per tensor, one pointer read from the
  tensor's fields and one comparison.

With torch's function the lists are compared in Python first, as the stamp always did.

The extension is built by the host's C++ compiler through ``torch.utils.cpp_extension`` (with ninja;
no CUDA code, so no nvcc), into torch's extension cache (``TORCH_EXTENSIONS_DIR``, by default
``~/.cache/torch_extensions``) under a name made from the source, torch's version and Python's, so a
build for another torch is never loaded. Building it is a C++ compile, so it never happens unasked:

* :func:`build_pointer_check` builds it now (or loads the build already there);
* ``LFM2VL_PTRCHECK=build``: the first stamp of the process builds it if it is not built yet (and
  warns, then uses torch's, if it cannot);
* unset: a stamp uses the extension when it is already built, torch's function otherwise;
* ``LFM2VL_PTRCHECK=torch``: always torch's function.

A stamp chooses when it is armed (at capture, and again after a change that moved nothing), and
says what it chose in ``WeightStamp.pointer_check`` (:func:`make_check`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import shutil
import sys
import sysconfig
import warnings
from pathlib import Path

import torch

ENV = "LFM2VL_PTRCHECK"
MODES = ("", "build", "torch")
SOURCE = Path(__file__).with_name("ptrcheck.cpp")
TORCH, EXTENSION = "torch", "extension"

_CHOSEN: dict = {}  # "ext": the extension module or None, decided once per process (or by a build)
_LOADED: dict = {}  # the built file -> its module


def extension_name() -> str:
    """The extension's module name: a build is only ever loaded by the torch and Python it was built for."""
    key = SOURCE.read_bytes() + f"\0{torch.__version__}\0{sys.version}".encode()
    return "lfm2vl_ptrcheck_" + hashlib.sha256(key).hexdigest()[:12]


def extension_dir() -> Path:
    """Where the extension is built: its own folder in torch's extension cache."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if not root:
        # what torch.utils.cpp_extension.get_default_build_root() reads; importing cpp_extension itself
        # here would log a CUDA_HOME warning on machines without CUDA at every first capture
        from torch._appdirs import user_cache_dir

        root = os.path.realpath(user_cache_dir(appname="torch_extensions"))
    return Path(root) / extension_name()


def cannot_build() -> str | None:
    """Why the extension cannot be built here (no C++ compiler, ninja or Python headers), or None."""
    from torch.utils.cpp_extension import is_ninja_available

    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler ({compiler!r} is not on the PATH)"
    if not is_ninja_available():
        return "no ninja (torch.utils.cpp_extension builds with it)"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        return f"no Python headers (no Python.h in {sysconfig.get_paths()['include']})"
    return None


def load_built():
    """The extension module if it is already built here, else None: never compiles."""
    name = extension_name()
    lib = extension_dir() / f"{name}.so"
    if lib not in _LOADED and lib.exists():  # loaded once per process and file
        spec = importlib.util.spec_from_file_location(name, lib)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _LOADED[lib] = module
    return _LOADED.get(lib)


def build_pointer_check(verbose: bool = False):
    """Build the extension if it is not built yet (a C++ compile), load it, and let every stamp armed
    from now on use it. Returns the module; a one-line ``RuntimeError`` when it cannot be built."""
    module = load_built()
    if module is None:
        reason = cannot_build()
        if reason is not None:
            raise RuntimeError(f"the pointer-check extension cannot be built here: {reason}")
        from torch.utils.cpp_extension import load

        folder = extension_dir()
        folder.mkdir(parents=True, exist_ok=True)
        try:
            module = load(extension_name(), [str(SOURCE)], build_directory=str(folder), extra_cflags=["-O2"],
                          verbose=verbose)
        except Exception as e:  # the compiler's first "error:" line; its whole output stays in the chained error
            lines = [line.strip() for line in str(e).splitlines() if line.strip()]
            first = next((line for line in lines if "error:" in line), lines[-1] if lines else repr(e))
            raise RuntimeError(f"the pointer-check extension did not build in {folder}: {first}") from e
    _CHOSEN["ext"] = module
    return module


def _choose():
    """The extension module or None, as ``LFM2VL_PTRCHECK`` asks (read once per process)."""
    mode = os.environ.get(ENV, "")
    if mode not in MODES:
        raise ValueError(f"{ENV}={mode!r}: set it to 'build' (build the C++ pointer check when not built), "
                         "'torch' (torch's check only), or leave it unset (the C++ check when already built)")
    if mode == TORCH:
        return None
    try:
        return build_pointer_check() if mode == "build" else load_built()
    except Exception as e:  # a broken or unbuildable extension must never stop the graphs
        warnings.warn(f"{e}; the weight stamps use torch's pointer check", stacklevel=3)
        return None


def _lists_kept(lists) -> bool:
    """Each ``(module, modules, length)``: the module still holds that ``_modules`` dictionary, at that length."""
    for m, modules, n in lists:
        if m._modules is not modules or len(modules) != n:
            return False
    return True


def make_check(tensors: list, pointers: list, lists=()):
    """``(which, equal)``: which check is used (``"extension"`` or ``"torch"``), and a call with no
    arguments that is True while every tensor still has its pointer and every ``(module, modules,
    length)`` of ``lists`` still has ``module._modules is modules`` and ``len(modules) == length``."""
    if "ext" not in _CHOSEN:
        _CHOSEN["ext"] = _choose()
    ext = _CHOSEN["ext"]
    lists = [tuple(x) for x in lists]
    if ext is not None:
        return EXTENSION, ext.PointerCheck(tensors, pointers, lists).equal
    indices = list(range(len(tensors)))
    pointers_kept = functools.partial(torch._C._tensors_data_ptrs_at_indices_equal, tensors, pointers, indices)
    if not lists:
        return TORCH, pointers_kept

    def equal() -> bool:
        return _lists_kept(lists) and pointers_kept()

    return TORCH, equal


def use_pointer_check(which: str) -> None:
    """Make every stamp armed from now on use ``which``: ``"extension"`` (built first if it is not
    yet) or ``"torch"``. A stamp armed earlier keeps its check until it is re-armed."""
    if which not in (TORCH, EXTENSION):
        raise ValueError(f"pointer check {which!r}: use {TORCH!r} or {EXTENSION!r}")
    _CHOSEN["ext"] = build_pointer_check() if which == EXTENSION else None
