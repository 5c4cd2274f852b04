"""The ports each service listens on by default, on one machine.

Each service takes a block of three: (API, health, metrics). The SDK's default addresses
(client/settings.py), the services' default settings and `mqstore up` all read them here, so
none of them imports another's code for a number.
"""

from __future__ import annotations

DEFAULT_PORTS: dict[str, tuple[int, int, int]] = {
    "commitlog_svc": (7100, 7101, 7102),
    "cq_svc": (7200, 7201, 7202),
    "index_svc": (7300, 7301, 7302),
}
