"""A real etcd for the replication tests (the coordinator's fixtures: one etcd a session, a
group of its own per test)."""

from tests.coordination.conftest import coordinators, etcd, group

__all__ = ["coordinators", "etcd", "group"]
