"""`mqstore consume`: read a topic from where you say, print each message, optionally commit.

    mqstore consume TOPIC [--queue Q ...] [--from-offset N | --from-time T |
                           --from earliest|latest|committed] [--group G] [--follow]
                           [--count N] [--commit] [--json | --raw] [--tags EXPR]

A pull-mode Consumer: positions live here, so reading never changes anything in the store
unless --commit writes the group's offsets, after the messages were printed. A message's
offset is committed only once it has been printed, so --count N --commit moves the group
exactly N messages on, and Ctrl-C or SIGTERM (with --follow: the normal way to stop) commits
what was shown before exiting quietly (GracefulStop).
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from contextlib import nullcontext
from types import FrameType
from typing import Any, Final

import click

from mqstore.cli.options import CliState, NothingFound, echo_json, json_option, pass_state
from mqstore.cli.progress import Reporter
from mqstore.cli.render import message_line
from mqstore.cli.times import FORMS_HELP, TIME
from mqstore.client.admin import Admin
from mqstore.client.consumer import (
    RECONNECT_TIMEOUT_S_DEFAULT,
    Consumer,
    Offset,
    Start,
    Timestamp,
)
from mqstore.client.message import Message
from mqstore.errors import NotFound

START_NAMES: Final = ("earliest", "latest", "committed")
# Exit status after Ctrl-C stopped a read that had an end (no --follow): the shell's code for
# SIGINT, so a script can tell an interrupted dump from a complete one. With --follow, Ctrl-C
# is the way to stop and exits 0.
EXIT_INTERRUPTED: Final = 130
# While following, how long one poll waits for new messages before the loop looks at a stop
# request again: Ctrl-C answers within about this, at the cost of one idle long poll per
# queue per wake-up.
FOLLOW_WAKE_S: Final = 1.0


@click.command("consume")
@click.argument("topic")
@click.option(
    "--queue",
    "-q",
    "queue_ids",
    type=click.IntRange(min=0),
    metavar="Q",
    multiple=True,
    help="read only this queue; repeat for more (default: every queue, new ones too)",
)
@click.option(
    "--from-offset",
    type=click.IntRange(min=0),
    metavar="N",
    help="start at queue offset N of every queue read",
)
@click.option(
    "--from-time",
    "from_time_ms",
    type=TIME,
    help=f"start at the first message stored at or after this time; {FORMS_HELP}",
)
@click.option(
    "--from",
    "from_name",
    type=click.Choice(START_NAMES),
    help="earliest (all kept), latest (only new ones), committed (where --group left off, "
    "earliest where it never committed) [default: committed with --group, else earliest]",
)
@click.option("--group", "-g", help="consumer group: for --from committed and --commit")
@click.option("--follow", "-f", is_flag=True, help="keep waiting for new messages (Ctrl-C stops)")
@click.option(
    "--count", "-n", type=click.IntRange(min=1), metavar="N", help="stop after N messages"
)
@click.option(
    "--commit",
    is_flag=True,
    help="commit the group's offsets past the messages printed (at the end, or on Ctrl-C)",
)
@click.option("--tags", default="", metavar="EXPR", help='only these tags: "a || b" ("*": all)')
@click.option("--raw", is_flag=True, help="print only the bodies, one per line, as bytes")
@json_option
@pass_state
def consume(
    state: CliState,
    topic: str,
    queue_ids: tuple[int, ...],
    from_offset: int | None,
    from_time_ms: int | None,
    from_name: str | None,
    group: str | None,
    follow: bool,
    count: int | None,
    commit: bool,
    tags: str,
    raw: bool,
    as_json: bool,
) -> None:
    """Print the messages of TOPIC, from the start (or where you say) to the end.

    \b
    One line per message: queue:offset, store time, keys, body (shortened). --json prints
    each message whole as a JSON line; --raw only its body. Without --follow, stops once
    every queue is read to its end.

    \b
    Examples:
      mqstore consume orders
      mqstore consume orders --from-time '10 minutes ago' --follow
      mqstore consume orders --group billing --count 100 --commit --json
      mqstore consume orders --queue 0 --from-offset 1500 --raw > bodies.txt
    """
    given = [s for s in (from_offset, from_time_ms, from_name) if s is not None]
    if len(given) > 1:
        raise click.UsageError("give one of --from-offset, --from-time and --from")
    if from_name == "committed" and group is None:
        raise click.UsageError("--from committed needs --group")
    if commit and group is None:
        raise click.UsageError("--commit needs --group")
    if raw and as_json:
        raise click.UsageError("give --raw or --json, not both")
    start: Start | None = None
    if from_offset is not None:
        start = Offset(from_offset)
    elif from_time_ms is not None:
        start = Timestamp(from_time_ms)
    elif from_name == "earliest":
        start = "earliest"
    elif from_name == "latest":
        start = "latest"
    elif from_name == "committed":
        start = "committed"

    settings = state.settings()
    _check_queues(state, topic, queue_ids, follow)
    consumer = Consumer(
        state.connection(),
        topic,
        group=group,
        queues=queue_ids or None,
        start=start,
        tags=tags,
        # A one-off read fails as fast as the --timeout says; a follower rides out a restart
        # of the services as a long-running consumer does.
        reconnect_timeout_s=(
            max(settings.timeout_s, RECONNECT_TIMEOUT_S_DEFAULT) if follow else settings.timeout_s
        ),
    )
    show = _printer(raw, as_json)
    # With --count the end is known: a progress bar on a terminal, a line every few seconds in
    # a log; without it, the messages themselves are the progress.
    reporter = Reporter("consumed", total=count, unit="messages") if count else None
    if reporter is not None:
        show = _counting(show, reporter)
    with consumer, GracefulStop() as stop, reporter or nullcontext():
        if follow:
            _follow(consumer, show, count, stop)
        else:
            for message in consumer.messages(follow=False, limit=count):
                show(message)
                if stop.requested:
                    break
        if commit:
            consumer.commit()
    if stop.requested and not follow:
        click.get_current_context().exit(EXIT_INTERRUPTED)


def _counting(show: Callable[[Message], None], reporter: Reporter) -> Callable[[Message], None]:
    def counted(message: Message) -> None:
        show(message)
        reporter.advance()

    return counted


def _check_queues(state: CliState, topic: str, queue_ids: tuple[int, ...], follow: bool) -> None:
    """A topic nothing was stored in, or a queue it does not have: a one-off read exits 4 with
    why (it would print nothing and look like an empty topic); --follow says so on stderr and
    waits, as a consumer started before its producers does."""
    try:
        Admin(state.connection()).existing_queues(topic, queue_ids or None)
    except NotFound as err:
        if not follow:
            raise NothingFound(str(err)) from None
        click.echo(f"note: {err}; waiting for messages", err=True)


def _follow(
    consumer: Consumer, show: Callable[[Message], None], count: int | None, stop: GracefulStop
) -> None:
    """Print new messages until `count` or a stop request. poll() returns at least every
    FOLLOW_WAKE_S while nothing arrives, so a stop is noticed within about that."""
    printed = 0
    while not stop.requested and (count is None or printed < count):
        batch = consumer.poll(timeout_s=FOLLOW_WAKE_S)
        if count is not None and printed + len(batch) > count:
            kept = count - printed
            _unread(consumer, batch[kept:])
            batch = batch[:kept]
        for i, message in enumerate(batch):
            show(message)
            printed += 1
            if stop.requested:
                _unread(consumer, batch[i + 1 :])
                return


def _unread(consumer: Consumer, messages: list[Message]) -> None:
    """Move positions back to the first message not printed of each queue (poll moved them
    past its whole batch), so that a commit covers only what was printed."""
    first: dict[int, int] = {}
    for m in messages:
        first[m.queue_id] = min(first.get(m.queue_id, m.queue_offset), m.queue_offset)
    for queue_id, offset in first.items():
        consumer.seek(queue_id, offset)


class GracefulStop:
    """Ctrl-C (SIGINT) and SIGTERM ask the read to stop; the loop stops at the next message or
    wake-up, commits (--commit) and exits. A second signal stops at once (KeyboardInterrupt).

    Why not just catch KeyboardInterrupt: raised at an arbitrary bytecode, it can land inside
    gRPC's or threading's lock handling (a `with lock:` interrupted between acquire and its
    try block never releases), after which the commit can hang. A flag set by the handler
    interrupts nothing. A SIGINT that the parent ignores (a background job of a script)
    stays ignored."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():  # only it may set handlers
            for signum in (signal.SIGINT, signal.SIGTERM):
                if signal.getsignal(signum) is not signal.SIG_IGN:
                    self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()


def _printer(raw: bool, as_json: bool) -> Callable[[Message], None]:
    if as_json:
        return lambda m: echo_json(m.to_json())
    if raw:
        out = sys.stdout.buffer

        def write_raw(m: Message) -> None:
            out.write(m.body + b"\n")
            out.flush()

        return write_raw
    return lambda m: click.echo(message_line(m))
