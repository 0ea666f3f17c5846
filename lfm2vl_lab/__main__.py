"""``python -m lfm2vl_lab <subcommand>``: the command line lives in :mod:`lfm2vl_lab.cli.cli`."""

import sys

from .cli.cli import main

if __name__ == "__main__":
    sys.exit(main())
