"""``python -m lfm2vl_lab <subcommand>``: the command line lives in :mod:`lfm2vl_lab.tools.cli`."""

import sys

from .tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
