"""`python -m commitlog_svc`: see commitlog_svc.main."""

import sys

from commitlog_svc.main import main

sys.exit(main(sys.argv[1:]))
