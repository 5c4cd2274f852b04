"""commitlog_svc's Prometheus series (the mqstore_ prefix; grpc_server_* come from mqstore.rpc).

    mqstore_commitlog_appended_messages_total     counter    messages stored
    mqstore_commitlog_appended_bytes_total        counter    record bytes stored
    mqstore_commitlog_append_refused_total        counter    messages refused, by status
    mqstore_commitlog_append_duplicates_total     counter    idempotent retries answered
    mqstore_commitlog_flush_duration_seconds      histogram  one flush (msync = fsync of the range)
    mqstore_commitlog_flush_behind_bytes          gauge      written but not yet flushed
    mqstore_commitlog_{min,max,confirm}_offset    gauge      the log's offsets
    mqstore_commitlog_disk_{used,total}_bytes     gauge      the file system holding the log, as
                                                             retention and the disk-full check
                                                             count it (df's Use% = used/total)
    mqstore_dispatch_behind_bytes{subscriber}     gauge      log end minus what the subscriber's
                                                             stream has sent (or its confirmed
                                                             offset while it is disconnected)
    mqstore_subscriber_lag_bytes{subscriber}      gauge      log end minus its confirmed offset
    mqstore_replica_role{role}                    gauge      1 for this replica's role in its
                                                             broker group (absent: single)
    mqstore_replica_epoch                         gauge      the log's current epoch
    mqstore_replica_commit_offset                 gauge      what the in-sync set holds
    mqstore_replica_in_sync_size                  gauge      in-sync replicas (on the leader)
    mqstore_replica_lag_bytes{replica}            gauge      leader end minus a follower's end
    mqstore_replica_lag_seconds{replica}          gauge      since a follower last caught up
    mqstore_replica_terms_won_total               counter    leadership terms this replica won
    mqstore_recovery_truncated_bytes_total        counter    dirty tail cut by recovery
    mqstore_crc_mismatch_total{source}            counter    records failing their checks, found
                                                             by recovery, a read or dispatch

Gauges are computed when scraped, from the services of this process (normally one), so they
are never stale and cost nothing between scrapes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# Flush latency, from 50 us (a page already clean) to 5 s (a stalled disk).
FLUSH_BUCKETS_S = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                   0.1, 0.25, 0.5, 1.0, 2.5, 5.0)  # fmt: skip

APPENDED_MESSAGES = Counter(
    "mqstore_commitlog_appended_messages", "Messages stored in the commit log."
)
APPENDED_BYTES = Counter("mqstore_commitlog_appended_bytes", "Record bytes stored.")
APPEND_REFUSED = Counter(
    "mqstore_commitlog_append_refused", "Messages refused, by put status.", ["status"]
)
APPEND_DUPLICATES = Counter(
    "mqstore_commitlog_append_duplicates",
    "Idempotent retries answered with the first result (nothing stored).",
)
FLUSH_SECONDS = Histogram(
    "mqstore_commitlog_flush_duration_seconds",
    "Duration of one commit-log flush (msync of the dirty range).",
    buckets=FLUSH_BUCKETS_S,
)
RECOVERY_TRUNCATED_BYTES = Counter(
    "mqstore_recovery_truncated_bytes", "Bytes of dirty tail cut by commit-log recovery."
)
DISPATCH_FRAMES = Counter(
    "mqstore_commitlog_dispatch_frames",
    "Dispatch frames sent, by where they came from: the columns the newest appends left "
    "(append_frames.py), a scan of the log, or one already scanned for another subscriber in "
    "step (frame_cache.py).",
    ["source"],
)
CRC_MISMATCHES = Counter(
    "mqstore_crc_mismatch",
    "Commit-log records failing their CRC or length checks, by who found them.",
    ["source"],
)
CRC_SOURCES = ("recovery", "read", "dispatch")
# Every known label value exported at 0 from the start: a dashboard or an alert sees 0, not
# "no data", and rate() has a first sample before the first mismatch.
for _source in CRC_SOURCES:
    CRC_MISMATCHES.labels(_source)


@dataclass(slots=True)
class GaugeValues:
    min_offset: int
    max_offset: int
    confirm_offset: int
    flush_behind_bytes: int
    disk_used_bytes: int = 0
    disk_total_bytes: int = 0
    dispatch_behind: dict[str, int] = field(default_factory=dict)
    subscriber_lag: dict[str, int] = field(default_factory=dict)
    replica: ReplicaGauges | None = None  # a broker group's replica


@dataclass(slots=True)
class ReplicaGauges:
    role: str
    epoch: int
    commit_offset: int
    terms_won: int
    in_sync_size: int = 0  # the leader's view; 0 on a follower
    lag_bytes: dict[str, int] = field(default_factory=dict)
    lag_seconds: dict[str, float] = field(default_factory=dict)


class _ScrapeTime(Collector):
    def __init__(self) -> None:
        self._sources: dict[int, Callable[[], GaugeValues]] = {}
        self._lock = threading.Lock()

    def add(self, source: Callable[[], GaugeValues]) -> int:
        with self._lock:
            key = id(source)
            self._sources[key] = source
            return key

    def remove(self, key: int) -> None:
        with self._lock:
            self._sources.pop(key, None)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            sources = list(self._sources.values())
        values = []
        for source in sources:
            try:
                values.append(source())
            except Exception:  # a store closing under a scrape: skip it this time
                continue
        plain = {
            "flush_behind_bytes": GaugeMetricFamily(
                "mqstore_commitlog_flush_behind_bytes", "Bytes written but not yet flushed."
            ),
            "min_offset": GaugeMetricFamily(
                "mqstore_commitlog_min_offset", "Oldest commit-log offset on disk."
            ),
            "max_offset": GaugeMetricFamily(
                "mqstore_commitlog_max_offset", "End of the last whole record."
            ),
            "confirm_offset": GaugeMetricFamily(
                "mqstore_commitlog_confirm_offset", "How far dispatch may go."
            ),
            "disk_used_bytes": GaugeMetricFamily(
                "mqstore_commitlog_disk_used_bytes",
                "Bytes in use on the file system holding the commit log (as df counts).",
            ),
            "disk_total_bytes": GaugeMetricFamily(
                "mqstore_commitlog_disk_total_bytes",
                "Bytes this user can have on that file system: used plus available.",
            ),
        }
        behind = GaugeMetricFamily(
            "mqstore_dispatch_behind_bytes",
            "Log end minus what the subscriber has been sent.",
            labels=["subscriber"],
        )
        lag = GaugeMetricFamily(
            "mqstore_subscriber_lag_bytes",
            "Log end minus the subscriber's confirmed offset.",
            labels=["subscriber"],
        )
        for v in values:
            for name, family in plain.items():
                family.add_metric([], float(getattr(v, name)))
            for sub, nbytes in v.dispatch_behind.items():
                behind.add_metric([sub], float(nbytes))
            for sub, nbytes in v.subscriber_lag.items():
                lag.add_metric([sub], float(nbytes))
        yield from plain.values()
        yield behind
        yield lag
        yield from _replica_families([v.replica for v in values if v.replica is not None])


ROLES = ("leader", "follower", "candidate")


def _replica_families(replicas: list[ReplicaGauges]) -> Iterator[Metric]:
    if not replicas:
        return
    role = GaugeMetricFamily(
        "mqstore_replica_role", "1 for this replica's role in its broker group.", labels=["role"]
    )
    epoch = GaugeMetricFamily("mqstore_replica_epoch", "The log's current epoch.")
    commit = GaugeMetricFamily(
        "mqstore_replica_commit_offset", "What the whole in-sync set holds durably."
    )
    in_sync = GaugeMetricFamily(
        "mqstore_replica_in_sync_size", "Replicas in the in-sync set (the leader's view)."
    )
    terms = CounterMetricFamily(
        "mqstore_replica_terms_won", "Leadership terms this replica won (failovers to it)."
    )
    lag_bytes = GaugeMetricFamily(
        "mqstore_replica_lag_bytes", "Leader's end minus a follower's end.", labels=["replica"]
    )
    lag_seconds = GaugeMetricFamily(
        "mqstore_replica_lag_seconds",
        "Seconds since a follower last held everything the leader had.",
        labels=["replica"],
    )
    for r in replicas:
        for name in ROLES:
            role.add_metric([name], 1.0 if r.role == name else 0.0)
        epoch.add_metric([], float(r.epoch))
        commit.add_metric([], float(r.commit_offset))
        in_sync.add_metric([], float(r.in_sync_size))
        terms.add_metric([], float(r.terms_won))
        for name, nbytes in r.lag_bytes.items():
            lag_bytes.add_metric([name], float(nbytes))
        for name, seconds in r.lag_seconds.items():
            lag_seconds.add_metric([name], seconds)
    yield from (role, epoch, commit, in_sync, terms, lag_bytes, lag_seconds)


SCRAPE_TIME = _ScrapeTime()
REGISTRY.register(SCRAPE_TIME)
