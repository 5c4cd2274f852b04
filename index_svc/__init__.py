"""index_svc: the hash index of message keys and unique ids (docs/index.md).

formats/     pure byte layouts: index file (RocketMQ's), exact-mode companion, checkpoint
keyhash      Java and 64-bit key hashes and shards, a dispatch batch at a time (numpy)
index_file   one index file and its companion on disk: batch put, chain walk, flush, cut
recovery     what open keeps, cuts and replays (decision table)
confirm      candidates checked against records (RocketMQ #3613), pure
engine       IndexEngine: apply, query, lookup, flush, handshake, truncate, delete
"""
