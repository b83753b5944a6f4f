"""``python -m tokenbucket``: the ``tokenbucket`` command (:func:`tokenbucket.cli.main.main`)."""

from __future__ import annotations

import sys

from tokenbucket.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
