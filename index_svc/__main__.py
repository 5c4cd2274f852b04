"""`python -m index_svc`: see index_svc/main.py."""

import sys

from index_svc.main import main

sys.exit(main())
