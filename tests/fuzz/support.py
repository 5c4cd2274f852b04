"""What the short forms share: example budgets and the known-findings filter.

The hypothesis tests here feed the fuzz targets' own checks (fuzz/targets/), so the rules are
stated once. A finding fuzz/known.py lists has its own strict xfail test (test_known_findings.py);
the property tests step over it (and only it), so that they still catch every new one.
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import HealthCheck, settings

from fuzz.findings import signature
from fuzz.known import KNOWN

# Bounded: the whole directory must stay under about 40 s on the shared 2-core machine.
CODEC = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
API = settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def unless_known(one: Callable[[bytes], None], data: bytes) -> None:
    """one(data), re-raising anything but a known finding."""
    try:
        one(data)
    except Exception as exc:
        if signature(exc) not in KNOWN:
            raise
