"""What the recorded files say: the reference set and its DataFrames, the generated tables and sentences of
the pages, the figures, the docs site's figure page, and the notebooks' helpers that read the set. It reads
result files and the measuring code's definitions; it measures nothing.
"""
