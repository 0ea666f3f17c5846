"""What a set of CUDA graphs reads but does not own, and how the owner notices when it changes.

A graph replays fixed device addresses. The encoder's and the text engine's graphs read the model's
parameters and buffers, which the graphs do not own: ``model.half()``, ``model.cpu().cuda()`` or
``load_state_dict(..., assign=True)`` give them new storage, and a replay would then read freed or
reused memory (on the H200: silently wrong output after ``.to(float16)``, an illegal memory access
that kills the process after ``.cpu().cuda()``). Loading weights *in place* (``load_state_dict``
without ``assign``, ``copy_``) keeps every address, so the graphs simply read the new values.

:class:`WeightStamp` records, at capture, each tensor's storage pointer, dtype and device, and keeps
a ``dirty`` flag that two kinds of hook raise:

* ``Module._apply`` (what ``to``, ``half``, ``float``, ``cuda`` and ``cpu`` go through), wrapped on
  every watched module: moving or casting any part of the model marks its stamps;
* torch's global parameter / buffer / submodule registration hooks: assigning a new parameter
  (``assign=True`` loading, ``fused_qkv`` re-pointing the q/k/v weights) marks them too.

Hooks alone miss what bypasses ``nn.Module``: ``param.data = other`` (many loaders and quantisation
helpers do it) or ``torch.utils.swap_tensors`` on one tensor. So the hot path
(:meth:`WeightStamp.current`) also compares every tensor's storage pointer with the one recorded, in
C++ with no Python per tensor: torch's ``torch._C._tensors_data_ptrs_at_indices_equal`` (what inductor's
CUDA-graph trees use for the same purpose), or, once it is built, the kit's own ``PointerCheck``, which
takes the tensors once instead of converting its argument lists on every call (core/ptrcheck.py says
how to build it; ``pointer_check`` says which one a stamp uses). The 450M encoder's graphs read about
200 tensors, the 1.6B's about 440. Only when the flag or a pointer says "changed" does
:meth:`WeightStamp.changes` compare every tensor in Python, and name what moved.

A stamp reads its parts through a callable, so the slow path sees the model *as it is now*: a part
replaced on the module above it (``model.model.multi_modal_projector = new``) is found, because the
modules above the parts (``holders``) are watched for registrations too. ``ModuleList`` methods that
re-key the list without a registration (``insert``, ``del``, ``pop``) are seen by the list's own
dictionary and length, checked with the pointers (in the same C++ call where the kit's check is built).

Not seen: a tensor given the *same* storage under another shape or stride (``p.data = p.data.t()``),
which keeps its pointer; and a module written straight into a list's private dictionary
(``layers._modules["3"] = new``), which fires no hook and keeps the dictionary and its length
(``layers[3] = new`` goes through ``nn.Module.__setattr__`` and is seen).
"""

from __future__ import annotations

import types
import weakref

import torch
from torch import nn

from .ptrcheck import make_check

# module → the stamps that watch it (weak both ways: a stamp dies with its manager, a module with its model)
_WATCHED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_HOOKS: list = []

Record = tuple[int, torch.dtype, torch.device]


def _mark(module: nn.Module) -> None:
    for stamp in list(_WATCHED.get(module, ())):
        stamp.drop()


def _on_register(module, name, value):
    _mark(module)  # returns None: the registered value stays as it is


def _apply(self, fn, *args, **kwargs):
    """``Module._apply`` of a watched module: mark its stamps, then the class's own ``_apply``.
    Named ``_apply`` because pickling a bound method looks the method up again by its name."""
    _mark(self)
    return type(self)._apply(self, fn, *args, **kwargs)


def _install_hooks() -> None:
    if not _HOOKS:  # once per process: the hooks are global, and cost one dict lookup per registration
        mm = torch.nn.modules.module
        _HOOKS.extend([mm.register_module_parameter_registration_hook(_on_register),
                       mm.register_module_buffer_registration_hook(_on_register),
                       mm.register_module_module_registration_hook(_on_register)])


def named_tensors(parts: dict[str, nn.Module]) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of ``parts``, named ``part.path.to.tensor``."""
    out = {}
    for prefix, part in parts.items():
        for name, t in part.named_parameters(remove_duplicate=False):
            out[f"{prefix}.{name}"] = t
        for name, t in part.named_buffers(remove_duplicate=False):
            if t is not None:
                out[f"{prefix}.{name}"] = t
    return out


def where(rec: Record) -> str:
    return f"{rec[2]} {str(rec[1]).removeprefix('torch.')}"


def _as_reader(parts):
    """``parts`` as a callable that returns them (a dict is taken as it is, once)."""
    if callable(parts):
        return parts
    fixed = dict(parts)
    return lambda: fixed


class WeightStamp:
    """The storage pointer, dtype and device of every tensor of the graphs' parts at capture, and a
    check of them on every call. ``parts``: a dict of name → module the graphs read, or a callable
    that returns it as the model is now (re-read on the slow path); ``holders``: modules above the
    parts, whose attribute assignments can put another module in a part's place."""

    def __init__(self, parts, holders=()):
        self.read_parts = _as_reader(parts)
        now = self.read_parts()
        tensors = named_tensors(now)
        self.recorded = {name: (t.data_ptr(), t.dtype, t.device) for name, t in tensors.items()}
        self.dirty = False
        self._arm(now, tensors)
        _install_hooks()
        for m in [*holders, *(m for part in now.values() for m in part.modules())]:
            _WATCHED.setdefault(m, weakref.WeakSet()).add(self)
            if "_apply" not in m.__dict__:
                m.__dict__["_apply"] = types.MethodType(_apply, m)

    def _arm(self, parts: dict, tensors: dict) -> None:
        """What :meth:`current` compares: the tensors in the recorded order with their recorded
        pointers, and each ``ModuleList``'s dictionary and length."""
        names = list(self.recorded)
        lists = [(m, m._modules, len(m._modules)) for part in parts.values() for m in part.modules()
                 if isinstance(m, nn.ModuleList)]
        # which: "extension" or "torch" (core/ptrcheck.py); _equal: the whole comparison (lists, then
        # pointers), with no arguments
        self.pointer_check, self._equal = make_check([tensors[n] for n in names],
                                                     [self.recorded[n][0] for n in names], lists)

    def drop(self) -> None:
        """Raise the flag and let go of the tensors (a model moved off the GPU frees its memory at
        once, not at the next call)."""
        self.dirty, self._equal = True, None

    def current(self) -> bool:
        """The hot-path check: False when a hook fired, a list was re-keyed or any tensor's storage
        moved (then ask :meth:`changes` what, if anything, changed)."""
        if self.dirty:
            return False
        return self._equal()

    def _read(self) -> dict[str, Record]:
        return {name: (t.data_ptr(), t.dtype, t.device) for name, t in named_tensors(self.read_parts()).items()}

    def changes(self) -> list[str]:
        """What differs from the recorded stamp, one line per tensor (empty: nothing that matters,
        e.g. ``.to()`` to where the model already was)."""
        now, out = self._read(), []
        for name, rec in self.recorded.items():
            cur = now.get(name)
            if cur is None:
                out.append(f"{name} was removed")
            elif cur[1:] != rec[1:]:
                out.append(f"{name} moved from {where(rec)} to {where(cur)}")
            elif cur[0] != rec[0]:
                out.append(f"{name} was replaced by new storage ({where(cur)})")
        out += [f"{name} was added ({where(now[name])})" for name in now.keys() - self.recorded.keys()]
        return out

    def rearm(self) -> None:
        """After :meth:`changes` found nothing: clear the flag and take the tensors again."""
        parts = self.read_parts()
        self._arm(parts, named_tensors(parts))
        self.dirty = False


def change_warning(owner, whose: str, changes: list[str], on_gpu: bool, off_gpu: str) -> str | None:
    """What ``owner`` (a manager with a ``warned_change`` flag) says when the weights under its graphs
    changed: the first time, and whenever they left the GPU; None otherwise."""
    if owner.warned_change and on_gpu:
        return None
    owner.warned_change = True
    then = "capturing the graphs again" if on_gpu else f"no graphs on a CPU: {off_gpu}"
    return f"{whose} weights changed since capture ({change_summary(changes)}); {then}"


def change_summary(changes: list[str], limit: int = 2) -> str:
    """The first ``limit`` changes, then how many more."""
    more = len(changes) - limit
    return "; ".join(changes[:limit]) + (f"; and {more} more" if more > 0 else "")
