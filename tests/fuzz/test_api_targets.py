"""Short forms of the API fuzz targets: fuzzed requests to the three live services, checked by
the targets' own rules (fuzz/targets/*_api.py): an answer or a typed status, no partial write.

The commit-log target gets its own stack: a known finding (an idempotent append refused whole
stops the store's flush thread) makes it replace the stack it broke, which must not be the one
the other tests share.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz.services import Stack
from fuzz.targets.commitlog_api import CommitLogApi
from fuzz.targets.cq_api import CqApi
from fuzz.targets.index_api import IndexApi
from tests.fuzz.support import API, unless_known


@pytest.fixture(scope="module")
def commitlog_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CommitLogApi]:
    stacks: list[Stack] = []

    def renew() -> Stack:
        if stacks:
            stacks[-1].stop()
        stack = Stack(str(tmp_path_factory.mktemp("commitlog-api")))
        stacks.append(stack)
        stack.seed()
        return stack

    api = CommitLogApi(renew(), renew)
    yield api
    stacks[-1].stop()


@API
@given(data=st.binary(max_size=200))
def test_commitlog_requests_get_an_answer_or_a_typed_status_and_refusals_store_nothing(
    commitlog_api: CommitLogApi, data: bytes
) -> None:
    unless_known(commitlog_api.one_input, data)


@API
@given(data=st.binary(max_size=200))
def test_consume_queue_requests_get_an_answer_or_a_typed_status_and_refusals_move_nothing(
    stack: Stack, data: bytes
) -> None:
    unless_known(CqApi(stack).one_input, data)


@API
@given(data=st.binary(max_size=200))
def test_key_queries_get_matching_messages_or_a_typed_status(stack: Stack, data: bytes) -> None:
    unless_known(IndexApi(stack).one_input, data)
