"""Kept for old command lines: the device-API translation benchmark is now ``trident bench device-api``.

    python benchmarks/device_api_bandwidth.py --sizes-mib 256 1024 --out results/device_api
    # the same as: trident bench device-api --sizes-mib 256 1024 --out results/device_api

See trident/bench/device_api.py and docs/benchmarks.md.
"""

import sys

from trident.bench.device_api import main

if __name__ == "__main__":
    sys.exit(main())
