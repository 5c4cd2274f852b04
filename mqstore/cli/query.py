"""`mqstore query`: find messages by key, by unique id, or by message id.

    mqstore query key TOPIC KEY [--begin T] [--end T] [--max N] [--all]
    mqstore query uniq TOPIC UNIQ_KEY
    mqstore query msg MSG_ID

Key and unique-id queries go to the index (the key's shard); a message id names a place in the
commit log and is read from there. Nothing found is exit 4, so a script can tell "no such
message" (4) from "the store failed" (1) and "the store is down" (3).
"""

from __future__ import annotations

from collections.abc import Iterable

import click

from mqstore.cli.options import CliState, NothingFound, echo_json, json_option, pass_state
from mqstore.cli.render import message_block, message_line
from mqstore.cli.times import FORMS_HELP, TIME
from mqstore.client.admin import INDEX_RESULTS_MAX, Admin
from mqstore.client.message import Message
from mqstore.errors import InvalidArgument
from mqstore.formats.msgid import decode_offset_msg_id

QUERY_MAX_DEFAULT = 64  # the index's own default (RocketMQ's defaultQueryMaxNum)


def _print_messages(messages: Iterable[Message], as_json: bool) -> int:
    printed = 0
    for m in messages:
        if as_json:
            echo_json(m.to_json())
        else:
            click.echo(f"{message_line(m)}  [{m.msg_id}]")
        printed += 1
    return printed


@click.group("query")
def query_group() -> None:
    """Find messages: by key (KEYS), by unique id (UNIQ_KEY), or by message id.

    Exit 4 when nothing matches.

    \b
    Examples:
      mqstore query key orders order-42
      mqstore query uniq orders 7F00000100002A9F0000000000000001
      mqstore query msg 7F000001000019640000000000000000
    """


@query_group.command("key")
@click.argument("topic")
@click.argument("key")
@click.option("--begin", "begin_ms", type=TIME, help=f"stored at or after; {FORMS_HELP}")
@click.option("--end", "end_ms", type=TIME, help="stored at or before (default: now)")
@click.option(
    "--max",
    "max_messages",
    type=click.IntRange(1, INDEX_RESULTS_MAX),
    default=QUERY_MAX_DEFAULT,
    show_default=True,
    help="at most this many, newest first",
)
@click.option("--all", "every", is_flag=True, help="every match, however many (pages by time)")
@json_option
@pass_state
def query_key(
    state: CliState,
    topic: str,
    key: str,
    begin_ms: int | None,
    end_ms: int | None,
    max_messages: int,
    every: bool,
    as_json: bool,
) -> None:
    """Messages of TOPIC whose KEYS hold KEY, newest first.

    One line each: queue:offset, store time, keys, body (shortened), [message id].
    --begin/--end bound the store time, both inclusive, to the millisecond.

    \b
    Examples:
      mqstore query key orders order-42
      mqstore query key orders order-42 --begin '1 day ago' --max 10
      mqstore query key orders order-42 --all --json > order-42.jsonl
    """
    if begin_ms is not None and end_ms is not None and end_ms < begin_ms:
        raise click.BadParameter("--end is before --begin", param_hint="'--end'")
    admin = Admin(state.connection())
    begin, end = begin_ms or 0, end_ms or 0
    if every:
        found: Iterable[Message] = admin.iter_key(topic, key, begin_ms=begin, end_ms=end)
    else:
        found = admin.query_by_key(
            topic, key, begin_ms=begin, end_ms=end, max_messages=max_messages
        )
    if not _print_messages(found, as_json):
        raise NothingFound(f"no message of topic {topic!r} has key {key!r} in that time")


@query_group.command("uniq")
@click.argument("topic")
@click.argument("uniq_key", metavar="UNIQ_KEY")
@json_option
@pass_state
def query_uniq(state: CliState, topic: str, uniq_key: str, as_json: bool) -> None:
    """Messages of TOPIC stored with this unique id (the producer's id of a message).

    Normally one; more when a producer sent the same message again on its own (without the
    store recognising the retry).

    \b
    Examples:
      mqstore query uniq orders 7F00000100002A9F0000000000000001
      mqstore query uniq orders 7F00000100002A9F0000000000000001 --json
    """
    found = Admin(state.connection()).query_by_uniq_key(topic, uniq_key)
    if not _print_messages(found, as_json):
        raise NothingFound(f"no message of topic {topic!r} has unique id {uniq_key!r}")


def _msg_id(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A malformed id is a bad argument (exit 2), told before any store is asked."""
    try:
        decode_offset_msg_id(value)
    except InvalidArgument as exc:
        raise click.BadParameter(str(exc), ctx, param) from exc
    return value


@query_group.command("msg")
@click.argument("msg_id", metavar="MSG_ID", callback=_msg_id)
@json_option
@pass_state
def query_msg(state: CliState, msg_id: str, as_json: bool) -> None:
    """The message with this message id (store host + commit-log offset), in full.

    Message ids are what `produce` prints as msg_id (RocketMQ's offset message id). Exit 4
    when the store does not hold it (never did, or the file expired).

    \b
    Examples:
      mqstore query msg 7F000001000019640000000000000000
      mqstore query msg 7F000001000019640000000000000000 --json | jq -r .body
    """
    m = Admin(state.connection()).get_message(msg_id)
    if as_json:
        echo_json(m.to_json())
    else:
        click.echo(message_block(m))
