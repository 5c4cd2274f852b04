"""`python -m cq_svc --data-dir D --commitlog-target host:port ...` (see cq_svc.main)."""

from __future__ import annotations

import sys

from cq_svc.main import main

sys.exit(main())
