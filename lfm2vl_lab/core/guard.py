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

Why hooks and not a comparison per call: the 450M encoder's graphs read about 200 tensors, the
1.6B's about 440, and reading that many pointers in Python costs tens of µs per ``encode``, more
than the check may cost. So the hot path (:meth:`WeightStamp.current`) reads the flag and the
pointer of one sentinel tensor per watched part; only when one of them says "changed" does
:meth:`WeightStamp.changes` compare every tensor, and name what moved.

Not seen: ``param.data = other`` or ``torch.utils.swap_tensors`` on a single tensor other than a
sentinel, done by hand. Everything that goes through ``nn.Module`` is seen.
"""

from __future__ import annotations

import types
import weakref

import torch
from torch import nn

# module → the stamps that watch it (weak both ways: a stamp dies with its manager, a module with its model)
_WATCHED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_HOOKS: list = []

Record = tuple[int, torch.dtype, torch.device]


def _mark(module: nn.Module) -> None:
    for stamp in _WATCHED.get(module, ()):
        stamp.dirty = True


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


class WeightStamp:
    """The storage pointer, dtype and device of every tensor of ``parts`` at capture, and a flag that
    says when one may have changed since. ``parts`` maps a name to a module the graphs read."""

    def __init__(self, parts: dict[str, nn.Module]):
        self.parts = dict(parts)
        self.recorded = self._read()
        self.dirty = False
        self._sentinels = self._first_tensors()
        _install_hooks()
        for part in self.parts.values():
            for m in part.modules():
                _WATCHED.setdefault(m, weakref.WeakSet()).add(self)
                if "_apply" not in m.__dict__:
                    m.__dict__["_apply"] = types.MethodType(_apply, m)

    def _read(self) -> dict[str, Record]:
        return {name: (t.data_ptr(), t.dtype, t.device) for name, t in named_tensors(self.parts).items()}

    def _first_tensors(self) -> list[tuple[torch.Tensor, int]]:
        firsts = [next(iter(p.parameters()), None) for p in self.parts.values()]
        return [(t, t.data_ptr()) for t in firsts if t is not None]

    def current(self) -> bool:
        """The hot-path check: False when a hook fired or a sentinel's storage moved (then ask
        :meth:`changes` what, if anything, changed)."""
        if self.dirty:
            return False
        for t, ptr in self._sentinels:
            if t.data_ptr() != ptr:
                return False
        return True

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
        """After :meth:`changes` found nothing: clear the flag (and take the sentinels again)."""
        self.dirty = False
        self._sentinels = self._first_tensors()

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
