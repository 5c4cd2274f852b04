"""A real store for the SDK tests: commitlog_svc, one cq_svc and one index_svc as processes on
loopback (ephemeral ports, a temp data directory), shared by every test of the run (of a
pytest-xdist worker) that takes `cluster`.

Tests that restart a service, or damage its files, take `fresh_cluster` or a store of their
own so they cannot disturb the others. Topics are unique per test (`topic` fixture), so tests
sharing a store stay apart. One store for the run, not one per module: a store's start and
stop cost 3-7 s on a loaded 2-core machine, and a dozen modules share it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqstore.client.settings import ClientSettings
from mqstore.testing.cluster import SMALL_INDEX_ARGS, Cluster, start_store

INDEX_ARGS = SMALL_INDEX_ARGS
_topics = itertools.count()


def start_cluster(root: Path, *, flush: str = "sync") -> Cluster:
    return start_store(root, flush=flush)


def settings_for(c: Cluster, **overrides: object) -> ClientSettings:
    return ClientSettings(
        commitlog=c.commitlog.target,
        cq=(c.followers["cq"].target,),
        index=(c.followers["index"].target,),
        **overrides,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(tmp_path_factory.mktemp("store"))
    try:
        yield c
    finally:
        c.stop_all()


@pytest.fixture
def fresh_cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = start_cluster(tmp_path / "store")
    try:
        yield c
    finally:
        c.stop_all()


@pytest.fixture
def settings(cluster: Cluster) -> ClientSettings:
    return settings_for(cluster)


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic no other test uses (RocketMQ's topic pattern: letters, digits, _ and -)."""
    name = "".join(ch if ch.isalnum() else "_" for ch in request.node.name)[:80]
    return f"{name}_{next(_topics)}"
