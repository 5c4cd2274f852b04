"""Chaos runs against the real services: kill -9 at seeded moments under load, restart, and
check every acknowledged append against an independent oracle (docs/chaos.md).

    plan.py      the seeded schedule (which service, when, for how long) and the messages
    oracle.py    what the producers were told, and the verdict for each message sent
    load.py      SDK producers and following SDK consumers, as threads
    services.py  the three services as processes: kill, restart, time the recovery
    check.py     the checks after the last cycle (log, reads, queues, consumers, index)
    run.py       the run, its figures, and the command line (`python -m chaos`)

A broker group's run (`--replicas 3`, issue 24):

    group_plan.py     the seeded faults: the leader killed, paused or cut off, a follower
                      killed or cut off, etcd restarted
    group.py          etcd, the replicas, cq_svc and index_svc as processes; who leads
    netns.py          a network namespace per replica, to cut one off (root only)
    group_check.py    the checks after every cycle (the log since the last commit offset,
                      acknowledgements, the replicas' bytes)
    group_figures.py  failover times and the other figures
    group_run.py      the run
"""
