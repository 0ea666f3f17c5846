"""One caller at a time on what a set of CUDA graphs reads and writes.

A graph replays into fixed buffers: its inputs, its output rows, a text engine's cache. Two threads
replaying one graph at once write each other's inputs and read each other's outputs; on the H200 two
threads calling one captured encoder gave wrong results, then an illegal memory access that lost the
CUDA context. vLLM never meets this: its ``EncoderCudaGraphManager`` belongs to the model runner,
which one engine thread drives. A notebook's ``ThreadPoolExecutor`` or a small web demo with two
workers calls one object from several threads, so every object here that owns graphs serialises its
calls with a :class:`Serial`.

A lock orders the host's work; the GPU's is ordered by stream. Threads usually queue on the same
stream (PyTorch's default), and then the lock is all it takes. A caller on another stream (a
``torch.cuda.stream(...)`` block) is first made to wait for everything the previous caller queued
(``wait_stream``), so its writes into the buffers never overtake the previous replay or the copy
of its output. Comparing the current stream with the last costs one raw-pointer read per call.

A text engine's request spans calls (``prompt`` → ``prefill`` → ``sample`` → ``decode``) and lives in
its buffers and cache between them, so a lock per call is not enough: another thread's ``prefill``
between two of them would continue the wrong prompt. :meth:`Serial.request` holds the lock for a
whole request; outside one, the request belongs to the thread that started it (``owner``), and any
other thread is refused at once with a one-line error.
"""

from __future__ import annotations

import contextlib
import functools
import threading

import torch


class Serial:
    """A re-entrant lock for one graph owner, with the hand-over between CUDA streams.

    >>> with self.serial.hold(device):   # the lock, then the stream hand-over on a CUDA device
    ...     ...                          # fill buffers, replay, copy the output out
    """

    def __init__(self, what: str = "this object"):
        self.what = what  # named in the errors
        self.lock = threading.RLock()
        self._key = None  # (device index, raw stream) of the last caller's stream
        self._last = None  # that stream
        self.owner: int | None = None  # the thread whose request the state holds, outside request()
        self._depth = 0  # request() blocks open in the owner thread

    def hold(self, device: torch.device | None) -> Serial:
        """Take the lock (waiting for another thread's call to end); on a CUDA ``device``, make the
        current stream wait for the last caller's when they differ (None: no stream to hand over).
        Use as ``with serial.hold(device):``."""
        self.lock.acquire()
        if device is not None and device.type == "cuda":
            try:
                self._follow(device)
            except BaseException:
                self.lock.release()
                raise
        return self

    def _follow(self, device: torch.device) -> None:
        index = device.index if device.index is not None else torch.cuda.current_device()
        key = (index, torch._C._cuda_getCurrentRawStream(index))
        if key != self._key:
            current = torch.cuda.current_stream(index)
            if self._last is not None and self._last.device == current.device:
                current.wait_stream(self._last)
            self._key, self._last = key, current

    def __enter__(self) -> Serial:
        return self

    def __exit__(self, *exc) -> None:
        self.lock.release()

    # -- requests that span calls --------------------------------------------------------------------
    @contextlib.contextmanager
    def request(self, device: torch.device | None):
        """Hold the lock for one whole request of the calling thread (re-entrant)."""
        with self.hold(device):
            self.claim()
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.owner = None

    def claim(self) -> None:
        """The calling thread starts or goes on with a request: refused while another thread's
        request, started outside :meth:`request`, holds the state."""
        me = threading.get_ident()
        if self.owner is None:
            self.owner = me
        elif self.owner != me:
            raise RuntimeError(f"{self.what}: {_thread_name(self.owner)!r} holds its request (started outside "
                               f"`with ….request():`), so {threading.current_thread().name!r} may not overwrite "
                               "it; wrap every request in `with ….request():` or give each thread its own")

    def check_request(self, what: str, by: int | None) -> None:
        """``what`` goes on with the request thread ``by`` started: refused from any other thread."""
        if by != threading.get_ident():
            raise RuntimeError(f"{self.what}.{what}(): it holds a request another thread started since this "
                               "thread's; its tokens would not be this request's")


def serialised(request: bool):
    """Decorate a method of an object with ``serial`` and ``device``: it runs under the lock; with
    ``request``, it reads or writes the request in the object's state (:meth:`Serial.claim`)."""
    def wrap(fn):
        @functools.wraps(fn)
        def inner(self, *args, **kwargs):
            with self.serial.hold(self.device):
                if request:
                    self.serial.claim()
                return fn(self, *args, **kwargs)
        return inner
    return wrap


def _thread_name(ident: int) -> str:
    return next((t.name for t in threading.enumerate() if t.ident == ident), f"thread {ident}")
