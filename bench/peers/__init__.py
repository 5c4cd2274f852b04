"""mqstore next to what a Python user would pick instead: NATS JetStream, Redis Streams, and the
ceiling of a bare gRPC service moving the same batches (issue 8; `make bench-peers`).

    python -m bench.peers [--quick] [--only mqstore,nats,redis,ceiling] [--runs N] ...

Modules, one job each:
    servers.py        find (or apt-get install) nats-server / redis-server, start one on a free
                      loopback port with its own temp dir, stop it by PID
    common.py         scale, workloads, the foreign-load limit, the results store (the CPU
                      meter, percentiles and table forms are bench/meters.py, bench/report.py)
    mqstore_bench.py  the SDK (Producer, Consumer, Admin) against the services that
                      mqstore.testing.cluster.start_store starts
    nats_bench.py     nats-py: publish_async, pull fetch(1000), ordered push, by_start_time
    redis_bench.py    redis-py with hiredis: pipelined XADD, paged XRANGE, XRANGE by time
    grpc_ceiling.py   a trivial gRPC service (its own process, started by mqstore's launcher)
                      answering the same batches
    pacing.py         the paced producer loop and latency summary of append-to-visible
    table.py          the table (text and Markdown) and its notes
    run.py            the orchestrator: every workload for every size, N runs, doc and JSON

The method follows shared/reference/performance-limits.md: clients and servers are separate
processes on the same 2 cores over 127.0.0.1; each cell is the median of N runs with (min-max);
every run is watched for CPU used by processes that are not ours (machine busy time minus this
process and all its descendants), reported as "foreign" cores.
"""
