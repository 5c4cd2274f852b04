"""Issue 23, item 2, with --secure: request bytes that do not parse, sent without a token, are
UNAUTHENTICATED (the token is checked before the bytes are parsed; grpcio used to answer
INTERNAL and keep ~19 KB a call before any authentication), and with a valid token are
INVALID_ARGUMENT; either way nothing is kept and the log grows by a few lines at most.

Real processes under mutual TLS and tokens (conftest.py's secure_cluster); MQSTORE_MALFORMED_CALLS
sets the full form's calls per method, as in tests/e2e/test_malformed_requests.py.
"""

from __future__ import annotations

import pytest

from mqstore.launcher import ServiceProcess
from mqstore.rpc.channel import make_channel
from mqstore.testing.cluster import Cluster
from tests.e2e.malformed import api_methods, calls_from_env, flood
from tests.e2e.test_malformed_requests import SERVICES, assert_nothing_kept

from .conftest import Material

pytestmark = pytest.mark.timeout(1_800)

# Calls per service and token case in `make test` (the unsecured test has the reasoning).
MALFORMED_CALLS_SHORT = 1_000


def process_of(c: Cluster, name: str) -> ServiceProcess:
    return c.commitlog if name == "commitlog" else c.followers[name]


@pytest.mark.parametrize(
    ("token", "code"), [(None, "UNAUTHENTICATED"), ("admin", "INVALID_ARGUMENT")]
)
@pytest.mark.parametrize("name", list(SERVICES))
def test_malformed_requests_are_refused_first_for_want_of_a_token_and_keep_nothing(
    secure_cluster: Cluster, material: Material, name: str, token: str | None, code: str
) -> None:
    process = process_of(secure_cluster, name)
    methods = api_methods(SERVICES[name])
    per_method = calls_from_env(0)
    calls = per_method * len(methods) if per_method else MALFORMED_CALLS_SHORT
    security = material.security(token=material.tokens[token] if token else None)
    with make_channel(process.target, security) as channel:
        figures = flood(process, [(channel, methods)], calls, warm_up_calls=4 * len(methods))
    print(figures.figures(f"{name} (secure, token {token})"), dict(figures.codes))
    assert {c for _, c in figures.codes} == {code}, figures.codes
    assert {m for m, _ in figures.codes} == {m.path for m in methods}
    assert_nothing_kept(figures, name)
