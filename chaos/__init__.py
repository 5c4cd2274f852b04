"""Chaos runs against the real services: kill -9 at seeded moments under load, restart, and
check every acknowledged append against an independent oracle (docs/chaos.md).

    plan.py      the seeded schedule (which service, when, for how long) and the messages
    oracle.py    what the producers were told, and the verdict for each message sent
    load.py      SDK producers and following SDK consumers, as threads
    services.py  the three services as processes: kill, restart, time the recovery
    check.py     the checks after the last cycle (log, reads, queues, consumers, index)
    run.py       the run, its figures, and the command line (`python -m chaos`)
"""
