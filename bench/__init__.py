"""mqstore's benchmarks: each `python -m bench.<name>` module runs one, its docstring the method.

Shared by them, one job each:
    meters.py     CPU and memory from /proc (CpuMeter, Stopwatch, status_kib, rss_mib)
    report.py     percentiles, "median (min-max)" cells, tables, versions, doc blocks, JSON
    processes.py  the services' PIDs and settings, waiting for followers, the disk guard,
                  file handshakes with client processes (services start through
                  mqstore.testing.cluster and mqstore.launcher.ServiceProcess)
    lag.py        the dispatch-lag sampler of e2e_bench
    e2e_clients.py  the client processes of e2e_bench (e2e_bench.py is its orchestration)
    peers/        mqstore next to NATS JetStream, Redis Streams and a bare gRPC ceiling
"""
