"""index_svc's Prometheus series (the gRPC server's own are in mqstore.rpc.metrics).

Labels are bounded: `kind` is "key" or "uniq", `result` one of RESULTS.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from mqstore.rpc.metrics import LATENCY_BUCKETS_S

KINDS = ("key", "uniq")
# found: at least one message; empty: none; the rest name the status answered.
RESULTS = ("found", "empty", "invalid", "wrong_shard", "unavailable", "error")

QUERIES = Counter(
    "mqstore_index_queries_total",
    "Index queries answered, by kind (key, uniq) and result.",
    ["kind", "result"],
)
QUERY_SECONDS = Histogram(
    "mqstore_index_query_seconds",
    "Time to answer an index query, commit-log read included.",
    ["kind"],
    buckets=LATENCY_BUCKETS_S,
)
CANDIDATES = Counter(
    "mqstore_index_candidates_total",
    "Candidate offsets read back from the commit log to be confirmed.",
    ["kind"],
)
CONFIRMED = Counter(
    "mqstore_index_confirmed_total",
    "Candidates whose record really carries the topic and key (returned or not).",
    ["kind"],
)
COLLISIONS = Counter(
    "mqstore_index_collisions_dropped_total",
    "Candidates dropped because their record has another topic or key (a hash collision).",
    ["kind"],
)
EXPIRED = Counter(
    "mqstore_index_candidates_expired_total",
    "Candidates the commit log no longer holds (Read answered OUT_OF_RANGE).",
)
CORRUPT = Counter(
    "mqstore_index_candidates_corrupt_total",
    "Candidates whose record failed its checks (Read answered CORRUPT, or it did not decode).",
)
KEYS_INDEXED = Counter(
    "mqstore_index_keys_indexed_total",
    "Keys written to the index (unique ids and KEYS tokens of this shard).",
)
ENTRIES_APPLIED = Counter(
    "mqstore_index_dispatch_entries_total",
    "Dispatch entries received from the commit log (replays included).",
)
APPLIED_OFFSET = Gauge(
    "mqstore_index_applied_offset_bytes", "End of the last dispatch entry applied."
)
CONFIRMED_OFFSET = Gauge(
    "mqstore_index_confirmed_offset_bytes", "Offset below which the index is flushed."
)
DISPATCH_LAG_BYTES = Gauge(
    "mqstore_index_dispatch_behind_bytes",
    "Commit-log bytes known to exist (handshake max offset or the latest batch's end) and "
    "not yet applied.",
)
DISPATCH_LAG_SECONDS = Gauge(
    "mqstore_index_dispatch_lag_seconds",
    "Store time of the newest entry applied, subtracted from the time it was applied.",
)
CAUGHT_UP = Gauge(
    "mqstore_index_caught_up", "1 once the replica applied what the log held at the handshake."
)
for _kind in KINDS:  # exported from the start: a dashboard shows 0, not "no data"
    QUERY_SECONDS.labels(_kind)

FLUSH_FAILURES = Counter(
    "mqstore_index_flush_failures_total", "Flushes or checkpoints that failed (writes stop)."
)
