"""Private helpers with no tuning knowledge.

Tables, bounded JSON, files, typed records, CLI arguments, plots and progress lines. They import
nothing from tunetree but :mod:`tunetree.errors`, so every room may use them.
"""
