"""``python -m gaescan``: the ``gaescan`` command (``bench``, ``info``, ``gpu-check``)."""

import sys

from .bench.cli import main

sys.exit(main())
