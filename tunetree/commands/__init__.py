"""Subcommands of the ``tunetree`` command line that do more than read a file.

One module per command; :mod:`tunetree.cli` adds them to its parser.
"""
