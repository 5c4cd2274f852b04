"""cq_svc's Prometheus series (the grpc_server_* ones come from mqstore.rpc.metrics).

Registered once per process at import; gauges that read live state are bound (their
`set_function`, GROUP_LAG's `bind`) by whoever owns that state: CqService.start (main.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from mqstore.rpc.metrics import LATENCY_BUCKETS_S

PULLS = Counter("mqstore_cq_pulls_total", "Pulls answered, by GetMessageStatus.", ["status"])
PULL_SECONDS = Histogram(
    "mqstore_cq_pull_seconds",
    "One look at a queue: the consume-queue scan plus the commit log's Read (no waiting).",
    buckets=LATENCY_BUCKETS_S,
)
PULLED_MESSAGES = Counter("mqstore_cq_pulled_messages_total", "Messages returned by Pull.")
RECEIVED_MESSAGES = Counter(
    "mqstore_cq_received_messages_total", "Messages handed out by Receive (redeliveries too)."
)
ACKS = Counter("mqstore_cq_acks_total", "Receipts presented to Ack, by result.", ["result"])
TAIL_RECORDS = Counter(
    "mqstore_cq_tail_records_total",
    "Records a pull looked for among the newest ones the dispatch brought (tail_records.py): "
    "hit (served without a commit-log Read) or miss.",
    ["result"],
)
LOCAL_READS = Counter(
    "mqstore_cq_local_reads_total",
    "Records a pull looked for in the commit log's segment files (--commitlog-dir, "
    "local_reads.py): hit (served without a commit-log Read), miss (not answerable there) or "
    "failed_check (read there, refused by the record checks; the Read decides).",
    ["result"],
)
READ_RECORDS = Counter(
    "mqstore_cq_read_records_total",
    "Records asked of the commit log, by what came back (ok, removed, corrupt, mismatch).",
    ["result"],
)
LONG_POLL_WAIT_SECONDS = Histogram(
    "mqstore_cq_long_poll_wait_seconds",
    "Time long polls waited, by how the wait ended (dispatched, timeout, cancelled, shutdown).",
    ["outcome"],
    buckets=LATENCY_BUCKETS_S,
)
LONG_POLLS_REFUSED = Counter(
    "mqstore_cq_long_polls_refused_total", "Long polls refused: too many were waiting."
)
LONG_POLLS_WAITING = Gauge("mqstore_cq_long_polls_waiting", "Long polls waiting now.")
APPLIED_ENTRIES = Counter(
    "mqstore_cq_applied_entries_total", "Consume-queue units written from dispatch batches."
)
HANDSHAKES = Counter(
    "mqstore_cq_handshakes_total", "Start-up handshakes with the commit log, by action.", ["action"]
)
DISPATCH_BEHIND = Gauge(
    "mqstore_cq_dispatch_behind_bytes",
    "Commit-log bytes not applied yet: the log's end (as last seen) minus the applied offset.",
)
APPLIED_OFFSET = Gauge("mqstore_cq_applied_offset", "Commit-log offset applied up to.")
CONFIRMED_OFFSET = Gauge(
    "mqstore_cq_confirmed_offset", "Commit-log offset applied and flushed up to."
)
TAIL_BYTES = Gauge(
    "mqstore_cq_tail_records_bytes", "Bytes of records held for tail pulls (tail_records.py)."
)
UNCLEAN_STARTS = Counter(
    "mqstore_cq_unclean_starts_total", "Opens that found the abort marker of an unclean exit."
)


# At most this many (group, topic) series a scrape: a store with more groups than that is
# better watched with `mqstore groups`; the ones past it are left out and counted.
GROUP_LAG_SERIES_MAX = 1000
# (group, topic, queue) -> how many messages the group has not consumed, from the engine.
GroupLags = Callable[[], Iterator[tuple[str, str, int, int]]]


class _GroupLag(Collector):
    """mqstore_cq_group_lag_messages{group,topic}: for every committed offset, the queue's max
    offset minus it, summed over the topic's queues; computed when scraped (as `mqstore
    groups` computes it), so never stale."""

    def __init__(self) -> None:
        self._source: GroupLags | None = None
        self._lock = threading.Lock()

    def bind(self, source: GroupLags | None) -> None:
        with self._lock:
            self._source = source

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            source = self._source
        lag = GaugeMetricFamily(
            "mqstore_cq_group_lag_messages",
            "Messages of a topic a consumer group has not consumed: each queue's max offset "
            "minus the group's committed offset, summed over the topic's queues.",
            labels=["group", "topic"],
        )
        left_out = GaugeMetricFamily(
            "mqstore_cq_group_lag_series_left_out",
            f"(group, topic) pairs past the {GROUP_LAG_SERIES_MAX} series a scrape shows.",
        )
        sums: dict[tuple[str, str], int] = {}
        dropped: set[tuple[str, str]] = set()
        try:
            for group, topic, _queue, behind in source() if source is not None else ():
                key = (group, topic)
                if key in sums or len(sums) < GROUP_LAG_SERIES_MAX:
                    sums[key] = sums.get(key, 0) + behind
                else:
                    dropped.add(key)
        except Exception:  # a store closing under a scrape: nothing this time
            sums, dropped = {}, set()
        for (group, topic), behind in sorted(sums.items()):
            lag.add_metric([group, topic], float(behind))
        left_out.add_metric([], float(len(dropped)))
        yield lag
        yield left_out


GROUP_LAG = _GroupLag()
REGISTRY.register(GROUP_LAG)
