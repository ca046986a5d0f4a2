"""``python -m gaescan.bench``: the same as ``gaescan bench``."""

import sys

from .cli import bench_main

sys.exit(bench_main())
