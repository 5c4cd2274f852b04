"""index_svc: the hash index of message keys and unique ids (docs/index.md).

formats/     pure byte layouts: index file (RocketMQ's), exact-mode companion, checkpoint
keyhash      Java and 64-bit key hashes and shards, a dispatch batch at a time
index_file   one index file and its companion on disk: batch put, chain walk, flush, cut
recovery     what open keeps, cuts and replays (decision table)
confirm      candidates checked against records (RocketMQ #3613), pure
engine       IndexEngine: apply, query, lookup, flush, handshake, truncate, delete

The service around the engine:
settings     IndexSettings (file < env < flags), shards from a pod ordinal
sink         the engine as the subscriber loop's DispatchSink; the idle flusher
records      candidates read back from commitlog_svc (one Read), decoded, damaged ones dropped
retention    the commit log's minimum offset followed: index files below it deleted
servicer     QueryByKey, QueryByUniqKey, GetStatus: validate, route, ready, confirm, answer
metrics      mqstore_index_* Prometheus series
main         the process: health, recovery, subscription, API, readiness, graceful stop
"""
