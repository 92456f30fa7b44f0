"""``python -m trident run -n 4 script.py``: the same as the ``trident`` command."""

import sys

from .cli import main

sys.exit(main())
