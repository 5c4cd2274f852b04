"""`python -m bench.peers`: see bench/peers/run.py."""

from __future__ import annotations

import sys

from bench.peers.run import main

sys.exit(main())
