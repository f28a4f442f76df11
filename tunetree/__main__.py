"""``python -m tunetree``: the ``tunetree`` command line (:mod:`tunetree.cli`)."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
