"""What the store holds and how it is doing: `status`, `topics`, `queues`, `offsets`.

    mqstore status                              commit log, subscribers and lag, replicas
    mqstore topics                              every topic with a consume queue
    mqstore queues TOPIC                        each queue's min and max offset
    mqstore groups [GROUP]                      consumer groups and their lag per topic
    mqstore offsets show GROUP TOPIC            a group's committed offsets and lag
    mqstore offsets reset GROUP TOPIC --to X    move a group (earliest, latest, an offset,
                                                or --to-time T)

Tables for people (rich), `--json` for scripts: one JSON document per command.
"""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table
from rich.text import Text

from mqstore.cli.options import (
    CliState,
    NothingFound,
    echo_json,
    json_option,
    pass_state,
    stderr_console,
    stdout_console,
)
from mqstore.cli.times import FORMS_HELP, TIME
from mqstore.client.admin import Admin, ClusterStatus, QueueInfo, ResetTarget
from mqstore.client.consumer import Timestamp


def _admin(state: CliState) -> Admin:
    return Admin(state.connection())


def _yes(flag: bool) -> Text:
    return Text("yes", style="green") if flag else Text("no", style="bold red")


def _cell(value: object) -> Text:
    """User data (topics, groups, addresses) as literal text: a "[" is not rich markup."""
    return Text(str(value))


@click.command("status")
@json_option
@pass_state
def status(state: CliState, as_json: bool) -> None:
    """How the store is doing: the commit log, its subscribers, every replica.

    \b
    The commit log must answer (exit 3 when it cannot be reached). Each configured cq and
    index replica is asked too; one that does not answer shows as unreachable, with why,
    and the command still exits 0: the table is the answer.

    \b
    Examples:
      mqstore status
      mqstore --cq cq-0:7200,cq-1:7200 --index ix-0:7300,ix-1:7300 status
      mqstore status --json | jq '.commitlog.subscribers[] | {subscriber_id, lag_bytes}'
    """
    cluster = _admin(state).status()
    if as_json:
        echo_json(cluster.to_json())
        return
    console = stdout_console()
    for table in _status_tables(cluster):
        console.print(table)


def _status_tables(cluster: ClusterStatus) -> list[Table]:
    cl = cluster.commitlog
    log = Table(title="commit log", title_justify="left")
    for name in ("address", "store host", "min offset", "max offset", "flushed", "unflushed",
                 "confirm offset", "flush", "writable"):  # fmt: skip
        numeric = "offset" in name or name in ("flushed", "unflushed")
        log.add_column(name, justify="right" if numeric else "left")
    log.add_row(
        _cell(cl.address),
        _cell(cl.store_host),
        str(cl.min_offset),
        str(cl.max_offset),
        str(cl.flushed_offset),
        str(cl.max_offset - cl.flushed_offset),
        str(cl.confirm_offset),
        cl.flush,
        _yes(cl.writable),
    )
    subs = Table(title="subscribers (dispatch to cq / index replicas)", title_justify="left")
    for name in ("subscriber", "connected", "last seen", "confirmed offset", "lag bytes",
                 "lag ms"):  # fmt: skip
        subs.add_column(name, justify="left" if name in ("subscriber", "connected") else "right")
    for s in cluster.commitlog.subscribers:
        subs.add_row(
            _cell(s.subscriber_id),
            _yes(s.connected),
            _ago(s.last_seen_age_s),
            str(s.confirmed_offset),
            str(s.lag_bytes),
            str(s.lag_ms),
        )
    replicas = Table(title="replicas", title_justify="left")
    for name in ("service", "address", "reachable", "caught up", "applied offset", "behind",
                 "shard", "detail"):  # fmt: skip
        replicas.add_column(
            name, justify="right" if name in ("applied offset", "behind") else "left"
        )
    for r in cluster.cq:
        if not r.reachable:
            replicas.add_row("cq", _cell(r.address), _yes(False), "", "", "", "", _cell(r.error))
            continue
        replicas.add_row(
            "cq",
            _cell(r.address),
            _yes(True),
            _yes(r.caught_up),
            str(r.applied_offset),
            str(max(0, cl.max_offset - r.applied_offset)),
            "",
            _cell(f"{r.store} store, {r.queue_count} queues"),
        )
    for ix in cluster.index:
        if not ix.reachable:
            replicas.add_row(
                "index", _cell(ix.address), _yes(False), "", "", "", "", _cell(ix.error)
            )
            continue
        replicas.add_row(
            "index",
            _cell(ix.address),
            _yes(True),
            _yes(ix.caught_up),
            str(ix.applied_offset),
            str(max(0, cl.max_offset - ix.applied_offset)),
            f"{ix.shard_index} of {max(1, ix.shard_count)}",
            "exact" if ix.exact else "",
        )
    return [log, subs, replicas]


@click.command("topics")
@json_option
@pass_state
def topics(state: CliState, as_json: bool) -> None:
    """List every topic that has a consume queue, one per line, sorted.

    \b
    Examples:
      mqstore topics
      mqstore topics --json | jq -r '.[]'
    """
    names = _admin(state).topics()
    if as_json:
        echo_json(names)
        return
    for name in names:
        click.echo(name)


def _ago(seconds: float | None) -> str:
    """How long ago, in its largest whole unit ("12 s ago", "3 min ago"); "-" when unknown."""
    if seconds is None:
        return "-"
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit} ago"
    return f"{int(seconds)} s ago"


@click.group("subscribers")
def subscribers_group() -> None:
    """The commit log's subscribers (consume-queue and index replicas) and their lag.

    A subscriber's confirmed offset holds retention back, so one that will not come back (a
    replica scaled away) must be forgotten, or the log keeps every segment from there on.

    \b
    Examples:
      mqstore subscribers list
      mqstore subscribers forget index-3
    """


@subscribers_group.command("list")
@json_option
@pass_state
def subscribers_list(state: CliState, as_json: bool) -> None:
    """Every subscriber: confirmed offset, lag in bytes and ms, connected or not, and when it
    last subscribed or confirmed (one gone for long still holds retention back: forget it)."""
    lags = _admin(state).lag()
    if as_json:
        echo_json([lag.to_json() for lag in lags])
        return
    table = Table(
        "subscriber",
        "confirmed offset",
        "sent offset",
        "lag bytes",
        "lag ms",
        "connected",
        "last seen",
    )
    for lag in lags:
        table.add_row(
            lag.subscriber_id,
            _cell(lag.confirmed_offset),
            _cell(lag.sent_offset if lag.connected else "-"),
            _cell(lag.lag_bytes),
            _cell(lag.lag_ms),
            _yes(lag.connected),
            _ago(lag.last_seen_age_s),
        )
    stdout_console().print(table)


@subscribers_group.command("forget")
@click.argument("subscriber_id")
@json_option
@pass_state
def subscribers_forget(state: CliState, subscriber_id: str, as_json: bool) -> None:
    """Forget SUBSCRIBER_ID so that it no longer holds retention back (it must be stopped)."""
    floor = _admin(state).forget_subscriber(subscriber_id)
    if as_json:
        echo_json({"forgotten": subscriber_id, "retention_floor": floor})
        return
    where = "no subscriber left" if floor < 0 else f"retention floor now {floor}"
    click.echo(f"forgot {subscriber_id}; {where}")


def _queue_row(q: QueueInfo) -> dict[str, Any]:
    return {**q.to_json(), "messages": q.messages}


@click.command("queues")
@click.argument("topic")
@json_option
@pass_state
def queues(state: CliState, topic: str, as_json: bool) -> None:
    """Show the queues of TOPIC: each one's min and max offset and its message count.

    The max offset is the next one to be written; min offset moves up as old commit-log files
    are deleted. Exit 4 when the topic has no queues (nothing was ever stored in it).

    \b
    Examples:
      mqstore queues orders
      mqstore queues orders --json
    """
    infos = _admin(state).queues(topic)
    if not infos:
        raise NothingFound(f"topic {topic!r} has no consume queues")
    if as_json:
        echo_json({"topic": topic, "queues": [_queue_row(q) for q in infos]})
        return
    table = Table(title=Text(f"queues of {topic}"), title_justify="left")
    for name in ("queue", "min offset", "max offset", "messages"):
        table.add_column(name, justify="right")
    for q in infos:
        table.add_row(str(q.queue_id), str(q.min_offset), str(q.max_offset), str(q.messages))
    table.add_row("all", "", "", str(sum(q.messages for q in infos)), style="bold")
    stdout_console().print(table)


# -- offsets ----------------------------------------------------------------------------------


@click.group("offsets")
def offsets_group() -> None:
    """A consumer group's committed offsets: show them, or move them.

    A committed offset is the next message the group reads from a queue (`consume --group G
    --commit` and Consumer.commit() write it).

    \b
    Examples:
      mqstore offsets show billing orders
      mqstore offsets reset billing orders --to earliest --dry-run
      mqstore offsets reset billing orders --to earliest
      mqstore offsets reset billing orders --to-time '2 hours ago'
    """


@offsets_group.command("show")
@click.argument("group")
@click.argument("topic")
@json_option
@pass_state
def offsets_show(state: CliState, group: str, topic: str, as_json: bool) -> None:
    """Show GROUP's committed offset on each queue of TOPIC, and its lag.

    Lag is what the group has not read yet: max offset - committed. A queue where the group
    never committed shows committed "-" and the whole queue as its lag (a consumer starting
    from "committed" falls back to earliest there). Exit 4 when the topic has no queues.

    \b
    Examples:
      mqstore offsets show billing orders
      mqstore offsets show billing orders --json | jq '.total_lag'
    """
    lag = _admin(state).group_lag(group, topic)
    if as_json:
        echo_json(lag.to_json())
        return
    table = Table(title=Text(f"group {group} on {topic}"), title_justify="left")
    for name in ("queue", "committed", "min offset", "max offset", "lag"):
        table.add_column(name, justify="right")
    for q in lag.queues:
        table.add_row(
            str(q.queue_id),
            "-" if q.committed is None else str(q.committed),
            str(q.min_offset),
            str(q.max_offset),
            str(q.lag),
        )
    table.add_row("all", "", "", "", str(lag.lag), style="bold")
    stdout_console().print(table)


@click.command("groups")
@click.argument("group", required=False)
@json_option
@pass_state
def groups(state: CliState, group: str | None, as_json: bool) -> None:
    """List the consumer groups, each with its lag on every topic it reads.

    A group is listed once it committed an offset (`consume --group G --commit`,
    Consumer.commit(), `offsets reset`) or received with acks. Lag is what the group has not
    read yet, over every queue of the topic (a queue it never committed in counts whole).
    Under --secure it needs an admin token. Exit 4 when there is no group (or not GROUP).

    \b
    Examples:
      mqstore groups
      mqstore groups billing
      mqstore groups --json | jq '.groups[] | select(.total_lag > 1000)'
    """
    listing = _admin(state).groups(group)
    if not listing.groups:
        raise NothingFound(f"no consumer group {group!r}" if group else "no consumer groups")
    if as_json:
        echo_json({"groups": [g.to_json() for g in listing.groups], "truncated": listing.truncated})
        return
    table = Table(title=Text("consumer groups"), title_justify="left")
    table.add_column("group")
    table.add_column("topic")
    for name in ("queues", "committed in", "lag"):
        table.add_column(name, justify="right")
    for g in listing.groups:
        committed = sum(q.committed is not None for q in g.queues)
        table.add_row(
            _cell(g.group), _cell(g.topic), str(len(g.queues)), str(committed), str(g.lag)
        )
    stdout_console().print(table)
    if listing.truncated:
        stderr_console().print("[yellow]cq_svc listed only the first groups: name one[/]")


class ResetTargetType(click.ParamType[str | int]):
    name = "earliest|latest|OFFSET"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> str | int:
        text = str(value).strip().lower()
        if text in ("earliest", "latest"):
            return text
        if text.isdigit():
            return int(text)
        self.fail(f"{value!r} is not earliest, latest or an offset (0 or more)", param, ctx)


@offsets_group.command("reset")
@click.argument("group")
@click.argument("topic")
@click.option(
    "--to",
    "to",
    type=ResetTargetType(),
    help="earliest (re-read everything kept), latest (skip to the end), or a queue offset "
    "(kept within each queue's min..max)",
)
@click.option(
    "--to-time",
    "to_time_ms",
    type=TIME,
    help=f"the first message stored at or after this time; {FORMS_HELP}",
)
@click.option(
    "--queue",
    "-q",
    "queue_ids",
    type=click.IntRange(min=0),
    metavar="Q",
    multiple=True,
    help="only this queue; repeat for more (default: every queue of TOPIC)",
)
@click.option(
    "--dry-run", is_flag=True, help="print what each queue would be set to; commit nothing"
)
@json_option
@pass_state
def offsets_reset(
    state: CliState,
    group: str,
    topic: str,
    to: str | int | None,
    to_time_ms: int | None,
    queue_ids: tuple[int, ...],
    dry_run: bool,
    as_json: bool,
) -> None:
    """Set GROUP's committed offsets on TOPIC, and print what each queue was set to.

    Consumers of the group that are running keep their own positions: stop them first, as
    with Kafka's kafka-consumer-groups --reset-offsets. Exit 4 when the topic has no queues.

    \b
    Examples:
      mqstore offsets reset billing orders --to earliest
      mqstore offsets reset billing orders --to 1500 --queue 2
      mqstore offsets reset billing orders --to-time 2026-11-21T10:00:00Z
    """
    if (to is None) == (to_time_ms is None):
        raise click.UsageError("give one of --to earliest|latest|OFFSET or --to-time TIME")
    target: ResetTarget
    if to_time_ms is not None:
        target = Timestamp(to_time_ms)
    elif to == "earliest":
        target = "earliest"
    elif to == "latest":
        target = "latest"
    else:
        assert isinstance(to, int)
        target = to
    admin = _admin(state)
    before = admin.group_offsets(group, topic)
    after = admin.reset_group_offsets(
        group, topic, target, queues=queue_ids or None, dry_run=dry_run
    )
    rows = [
        {"queue_id": q, "before": before.get(q), "offset": offset}
        for q, offset in sorted(after.items())
    ]
    if as_json:
        echo_json({"group": group, "topic": topic, "dry_run": dry_run, "queues": rows})
        return
    for r in rows:
        was = "-" if r["before"] is None else r["before"]
        click.echo(f"queue {r['queue_id']}: {was} -> {r['offset']}")
    if dry_run:
        click.echo("dry run: nothing committed", err=True)
