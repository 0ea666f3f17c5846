"""torch.profiler's C++ log, kept off the screen where it tells the reader nothing.

The profiler's C++ half (Kineto) writes its log straight to file descriptor 2, past ``sys.stderr``:
``profiler_start`` and ``profiler_stop`` markers (``USDT:``) and stage notes (``STAGE:``) around every
profile, and on a machine without a CUDA driver ``gpuGetDeviceCount failed with code 35`` at every stop
(code 35: no usable driver, which a CPU-only machine never has). A terminal prints those lines, and
JupyterLab shows them as stderr boxes under the cell, as if something had gone wrong.

:func:`quiet_profile` enters and leaves a profiler with fd 2 caught in a temporary file, drops those
known lines and writes every other line to ``sys.stderr``: a real error still reaches the screen. The
calls profiled in between run with fd 2 untouched. Kineto's own level (``KINETO_LOG_LEVEL``) cannot do
this: it is read once per process, and the ``USDT:`` markers print at every level.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile

# One Kineto log line: "<LEVEL>:<date> <time> <pid>:<tid> <file>:<line>] <message>"
KINETO_LINE = re.compile(r"(?P<level>[A-Z]+):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \S+:\d+\] (?P<message>.*)")
MARKER_LEVELS = ("USDT", "STAGE")  # trace markers and stage notes: no message to a reader
NO_DRIVER = "gpuGetDeviceCount failed"  # what Kineto says on a machine without CUDA


def is_noise(line: str, cuda_available: bool) -> bool:
    """Whether ``line`` is one of Kineto's lines that say nothing to a reader: a marker or stage note,
    or, where CUDA is not available, the failed device count. Any other line is kept."""
    m = KINETO_LINE.fullmatch(line.rstrip("\r\n"))
    if m is None:
        return False
    return m["level"] in MARKER_LEVELS or (not cuda_available and m["message"].startswith(NO_DRIVER))


@contextlib.contextmanager
def filtered_fd2(cuda_available: bool):
    """Catch what is written to file descriptor 2 inside the block; afterwards write its lines, less
    the noise of :func:`is_noise`, to ``sys.stderr`` (in a notebook: the cell's stderr output)."""
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 at all (an embedding host closed it): nothing to catch
        yield
        return
    sys.stderr.flush()  # what Python wrote before the block goes out before it, uncaught
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            text = caught.read().decode("utf-8", errors="replace")
    kept = "".join(line for line in text.splitlines(keepends=True) if not is_noise(line, cuda_available))
    if kept:
        sys.stderr.write(kept)
        sys.stderr.flush()


@contextlib.contextmanager
def quiet_profile(prof, cuda_available: bool | None = None):
    """``with prof:`` for a ``torch.profiler.profile``, its start and stop inside :func:`filtered_fd2`
    (``cuda_available``: by default, whether torch sees a CUDA device)."""
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    with filtered_fd2(cuda_available):
        prof.__enter__()
    try:
        yield prof
    finally:
        with filtered_fd2(cuda_available):
            prof.__exit__(None, None, None)
