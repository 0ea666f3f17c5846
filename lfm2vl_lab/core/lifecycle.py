"""The life of one set of CUDA graphs, whoever owns them: the encoder's manager and the text engine.

:class:`GraphLifecycle` holds the graphs, their memory pool and the stamp of what they read
(:class:`~.guard.WeightStamp`), and does for its owner what both do alike:

* **capture, all or nothing** (:meth:`GraphLifecycle.all_or_nothing`): when one graph of a capture
  fails, the owner keeps none of it, and :func:`~.capture.capture_failed` puts the stream and the
  random generator back; the error is raised again (a ``KeyboardInterrupt`` as it is, memory running
  out as a ``torch.OutOfMemoryError`` naming the graph and the owner's advice)
* **the stamp**, taken after a capture succeeded (:meth:`GraphLifecycle.stamped`) and checked on the
  hot path (:meth:`GraphLifecycle.current`)
* **following the model** (:meth:`GraphLifecycle.follow`): when the stamp says the weights moved, drop
  every graph, warn (the first time, and whenever the model left the GPU), and capture again where
  the model is now, counted in the owner's ``stats.recaptures``

What a capture records and when a call follows the model stay the owner's: the manager captures
every budget afresh, the engine adds shapes to what it has. Callers hold the owner's
:class:`~.serial.Serial`; nothing here takes a lock.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable

import torch

from .capture import capture_failed, gc_paused
from .guard import WeightStamp, change_summary, change_warning


class GraphLifecycle:
    """The graphs, pool and weight stamp of one graph owner.

    ``whose``: how the change warning names the weights (``"encoder graphs: the model's"``);
    ``off_gpu``: what the owner does when the model left the GPU (``"encode() runs eagerly"``);
    ``advice``: what a capture that ran out of memory tells the user to do.

    It holds nothing of its owner (no bound method, no closure over it): the owner, its graphs and
    their pool then go as soon as the last reference does, never later at a garbage collection,
    which may run in the middle of another capture (:func:`~.capture.gc_paused`).
    """

    def __init__(self, whose: str, off_gpu: str, advice: str):
        self.whose, self.off_gpu, self.advice = whose, off_gpu, advice
        self.graphs: dict = {}
        self.pool = None
        self.stamp: WeightStamp | None = None  # what the graphs read, as it was at capture
        self.warned_change = False  # change_warning's flag: said once, unless the model left the GPU
        self.last_change: str | None = None  # what moved, the last time the stamp said so

    def drop(self) -> None:
        """No graphs, no pool, no stamp."""
        self.graphs, self.pool, self.stamp = {}, None, None

    @staticmethod
    def new_pool(real: bool):
        """A fresh graph memory pool for a real capture (None for stand-ins, which allocate none)."""
        return torch.cuda.graph_pool_handle() if real else None

    @contextlib.contextmanager
    def all_or_nothing(self, real: bool, what: Callable[[], str], message=None, undo: Callable[[], None] | None = None):
        """Around a capture: on any failure (a ``KeyboardInterrupt`` too: a stopped cell leaves no half
        capture), ``undo()`` lets the owner forget what the capture made, then the process is put back
        and the error raised as :func:`~.capture.capture_failed` says. ``what()`` names the graph that
        failed (read then); ``message(exc)``, if given, words a failure that is not out of memory."""
        caller = torch.cuda.current_stream() if real else None
        try:
            with gc_paused() if real else contextlib.nullcontext():
                yield
        except BaseException as exc:
            if undo is not None:
                undo()
            err = capture_failed(exc, what(), caller, cuda=real, message=message, advice=self.advice)
            if err is exc:
                raise
            raise err from exc

    def stamped(self, stamp: WeightStamp) -> None:
        """After a capture succeeded (its warm-ups may re-derive weights): ``stamp`` is what the graphs
        read, taken now."""
        self.stamp = stamp

    def current(self) -> bool:
        """The hot-path check: True when there is no stamp to break or it still holds."""
        return self.stamp is None or self.stamp.current()

    def follow(self, on_gpu: Callable[[], bool], moved: Callable[[], None], recapture: Callable[[], bool],
               stats, stacklevel: int = 2) -> None:
        """After :meth:`current` said no: if the weights did change, ``moved()`` lets the owner follow
        the model (its buffers, its device), every graph is dropped (they read the old addresses), the
        change is said (``warnings.warn`` at ``stacklevel`` above the owner's caller) and, where
        ``on_gpu()``, ``recapture()`` captures again (True: it did, and the owner's ``stats.recaptures``
        counts it).
        Nothing changed that matters (``.to()`` to where the model already was): the stamp is re-armed."""
        changes = self.stamp.changes()
        if not changes:
            self.stamp.rearm()
            return
        self.last_change = change_summary(changes)
        moved()
        self.drop()
        gpu = on_gpu()
        said = change_warning(self, self.whose, changes, gpu, self.off_gpu)
        if said:
            warnings.warn(said, stacklevel=stacklevel + 1)
        if gpu and recapture():
            stats.recaptures += 1
