"""`python -m chaos`: see chaos/run.py and docs/chaos.md."""

import sys

from chaos.run import main

sys.exit(main())
