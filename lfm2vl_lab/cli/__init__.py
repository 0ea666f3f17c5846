"""The command line, ``python -m lfm2vl_lab <command>``: options (no torch at import, so ``--help`` is
immediate), argparse types, and one run function per command that calls :mod:`lfm2vl_lab.measure` or
:mod:`lfm2vl_lab.report`. Nothing below it imports argparse.
"""
