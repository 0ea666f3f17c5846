"""How fast this machine's host is, in three numbers, printed at the start of every device call
(scripts/h200_run.sh): :mod:`lfm2vl_lab.measure.host` says what each number is and why.

    python scripts/host_probe.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lfm2vl_lab.measure.host import ROUNDS, line, probe  # noqa: E402, F401

if __name__ == "__main__":
    print(line(probe()), flush=True)
