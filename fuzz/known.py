"""Findings already reported, by signature (fuzz/findings.py), with the strict xfail test that
reproduces each. `python -m fuzz` marks them "known" and fails only on new ones; the short forms
in tests/fuzz/ step over them. When a fix lands, its xfail test starts passing (strict: the
suite fails) and its lines here go.

Untyped exceptions are named by the innermost project function: under Python 3.11 a list
comprehension is its own frame ("<listcomp>").
"""

from __future__ import annotations

_TESTS = "tests/fuzz/test_known_findings.py::"
_DISPATCH_RAGGED = (
    _TESTS + "test_a_dispatch_frame_with_columns_of_different_lengths_is_refused_typed"
)
_DISPATCH_INDEX = _TESTS + "test_a_dispatch_frame_naming_a_topic_past_its_table_is_refused_typed"
_SNAPSHOT = _TESTS + "test_a_group_offsets_snapshot_that_does_not_parse_is_corrupt_file"
_NEWLINE_TOPIC = _TESTS + "test_a_topic_with_a_trailing_newline_is_refused"

KNOWN: dict[str, str] = {
    # mqstore/rpc/dispatch_codec.py decode_dispatch
    "ValueError@rpc/dispatch_codec.py:<listcomp>": _DISPATCH_RAGGED,
    "ValueError@rpc/dispatch_codec.py:decode_dispatch": _DISPATCH_RAGGED,
    "IndexError@rpc/dispatch_codec.py:<listcomp>": _DISPATCH_INDEX,
    "IndexError@rpc/dispatch_codec.py:decode_dispatch": _DISPATCH_INDEX,
    "dispatch.topic-index-outside-table": _TESTS
    + "test_a_negative_topic_index_is_refused_not_read_as_another_topic",
    "dispatch.ragged-key-columns-accepted": _TESTS
    + "test_a_keys_column_of_the_wrong_length_is_refused_not_dropped",
    # cq_svc/group_offsets.py decode_snapshot
    "error@cq_svc/group_offsets.py:decode_payload": _SNAPSHOT,
    "error@cq_svc/group_offsets.py:decode_snapshot": _SNAPSHOT,
    "UnicodeDecodeError@cq_svc/group_offsets.py:decode_payload": _SNAPSHOT,
    # commitlog_svc: the producer table, the Subscribe handshake
    "commitlog.store-stopped": _TESTS
    + "test_an_idempotent_append_refused_whole_does_not_stop_the_store",
    "commitlog.Subscribe.false-corruption": _TESTS
    + "test_a_confirmed_offset_inside_a_record_is_refused_not_reported_as_corruption",
    # mqstore/limits.py TOPIC_PATTERN ("$" also matches before a final newline)
    "commitlog.Append.topic-outside-pattern-stored": _NEWLINE_TOPIC,
    "commitlog.AppendStream.topic-outside-pattern-stored": _NEWLINE_TOPIC,
    "cq.CommitOffset.name-outside-pattern-accepted": _TESTS
    + "test_a_group_with_a_trailing_newline_is_refused",
}
