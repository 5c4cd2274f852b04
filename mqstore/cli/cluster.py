"""`mqstore cluster status`: a replicated commit log's broker group, replica by replica.

    mqstore cluster status          each replica's role, epoch, end and durable offsets, lag
                                    and membership of the in-sync set; the commit offset
    mqstore cluster status --json   the same as one JSON document
    mqstore cluster switchover      hand the lead to the most caught-up in-sync follower
        [--to NAME]                 ... or to this one
        [--if-leader]               only when the one replica given leads (a preStop hook)

Every replica listed in --commitlog / MQSTORE_COMMITLOG (a:7100,b:7100,c:7100) is asked for
its GetStatus; the leader's view adds each follower's progress. A replica that does not
answer shows as unreachable; the command exits 3 only when none answers.

A switchover is asked of the leader (commitlog.proto's Switchover): it refuses appends, waits
until the successor holds its whole log, hands its term over in etcd and answers once the
successor leads. Exit 0 when another replica leads, 1 when it could not be done (no in-sync
follower, it did not catch up in time: the lead stays), 3 when no replica answers.
"""

from __future__ import annotations

from typing import Any

import click
import grpc
from rich.table import Table
from rich.text import Text

from mqstore.cli.options import (
    CliState,
    CommandError,
    Unreachable,
    as_command_error,
    echo_json,
    json_option,
    pass_state,
    stdout_console,
)
from mqstore.client.errors import from_rpc_error
from mqstore.client.settings import split_addresses
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as pb_grpc

# A replica has this long to answer (a stopped one must not hold the table up).
STATUS_TIMEOUT_S = 3.0
# A switchover's own bound, unless --timeout-s says otherwise (the service's default).
SWITCHOVER_TIMEOUT_S = 10.0
# The call may take the switchover's bound plus the round trip to answer.
SWITCHOVER_CALL_SLACK_S = 5.0


@click.group("cluster")
def cluster_group() -> None:
    """A replicated commit log's broker group (docs/replication.md)."""


def _ask(state: CliState, target: str) -> pb.GetStatusResponse | str:
    connection = state.connection()
    stub = pb_grpc.CommitLogStub(connection.channel(target))
    try:
        answer: pb.GetStatusResponse = stub.GetStatus(
            pb.GetStatusRequest(), timeout=STATUS_TIMEOUT_S, metadata=connection.metadata
        )
        return answer
    except grpc.RpcError as err:
        return f"{err.code().name}: {err.details() or ''}".strip()


def _row(
    target: str, answer: pb.GetStatusResponse | str, leader: pb.GetStatusResponse | None
) -> dict[str, Any]:
    if isinstance(answer, str):
        return {"address": target, "reachable": False, "error": answer}
    row: dict[str, Any] = {
        "address": target,
        "reachable": True,
        "replica": answer.replica,
        "group": answer.group,
        "role": answer.role,
        "epoch": answer.history.epochs[-1] if answer.history.epochs else 0,
        "end_offset": answer.max_offset,
        "durable_offset": answer.flushed_offset,
        "commit_offset": answer.commit_offset,
        "leader": answer.leader,
    }
    if leader is not None:
        seen = {r.name: r for r in leader.replicas}
        mine = seen.get(answer.replica)
        if mine is not None:
            row["in_sync"] = mine.in_sync
            row["lag_bytes"] = mine.lag_bytes
            row["caught_up_ms_ago"] = mine.caught_up_ms_ago
    return row


@cluster_group.command("status")
@json_option
@pass_state
def cluster_status(state: CliState, as_json: bool) -> None:
    """Every replica of the broker group: role, epoch, offsets, lag, in-sync.

    \b
    Examples:
      mqstore cluster status
      MQSTORE_COMMITLOG=127.0.0.1:7100,127.0.0.1:7110,127.0.0.1:7120 mqstore cluster status --json
    """
    targets = state.settings().commitlog_targets
    answers = {t: _ask(state, t) for t in targets}
    if all(isinstance(a, str) for a in answers.values()):
        reasons = "; ".join(f"{t}: {a}" for t, a in answers.items())
        raise Unreachable(f"no commit-log replica answered ({reasons})")
    leaders = [
        a for a in answers.values() if not isinstance(a, str) and a.role in ("leader", "single")
    ]
    leader = leaders[0] if len(leaders) == 1 else None
    rows = [_row(t, a, leader) for t, a in answers.items()]
    commit = leader.commit_offset if leader is not None else None
    if as_json:
        echo_json({"leader": leader.replica if leader is not None else None,
                   "commit_offset": commit, "replicas": rows})  # fmt: skip
        return
    table = Table(title=f"commit offset {commit if commit is not None else '(no leader)'}")
    for column in ("replica", "address", "role", "epoch", "end", "durable", "lag bytes", "in sync"):
        table.add_column(column)
    for row in rows:
        if not row["reachable"]:
            table.add_row("?", Text(row["address"]), Text("unreachable", style="bold red"),
                          "", "", "", "", Text(row["error"]))  # fmt: skip
            continue
        in_sync = row.get("in_sync")
        table.add_row(
            Text(row["replica"] or "-"),
            Text(row["address"]),
            Text(row["role"], style="bold green" if row["role"] == "leader" else ""),
            str(row["epoch"]),
            f"{row['end_offset']:,}",
            f"{row['durable_offset']:,}",
            f"{row.get('lag_bytes', 0):,}",
            "-" if in_sync is None else ("yes" if in_sync else "no"),
        )
    stdout_console().print(table)


@cluster_group.command("switchover")
@click.option("--to", "successor", default="", help="The replica to hand the lead to (its name).")
@click.option(
    "--if-leader",
    is_flag=True,
    help="Only if the one replica given by --commitlog leads; otherwise do nothing (exit 0).",
)
@click.option(
    "--timeout-s",
    type=click.FloatRange(min=0.1, max=120.0),
    default=SWITCHOVER_TIMEOUT_S,
    show_default=True,
    help="How long the successor may take to catch up and lead.",
)
@click.option(
    "--commitlog",
    "addresses",
    default="",
    metavar="ADDRS",
    help="The replicas to ask (as mqstore --commitlog, which it overrides here).",
)
@json_option
@pass_state
def cluster_switchover(
    state: CliState,
    successor: str,
    if_leader: bool,
    timeout_s: float,
    addresses: str,
    as_json: bool,
) -> None:
    """Hand the lead of the broker group to an in-sync follower, losing no write.

    Appends pause while the successor catches up and takes over (well under a second when it
    keeps up); producers of the SDK follow the new leader on their own.

    \b
    Examples:
      mqstore cluster switchover
      mqstore cluster switchover --to commitlog_svc-2
      mqstore cluster switchover --if-leader --commitlog 127.0.0.1:7100   # a preStop hook
    """
    targets = split_addresses(addresses) or state.settings().commitlog_targets
    if if_leader and len(targets) != 1:
        raise click.UsageError(
            f"--if-leader takes exactly one replica's address, not {len(targets)}"
        )
    answers = {t: _ask(state, t) for t in targets}
    if all(isinstance(a, str) for a in answers.values()):
        reasons = "; ".join(f"{t}: {a}" for t, a in answers.items())
        raise Unreachable(f"no commit-log replica answered ({reasons})")
    leading = [t for t, a in answers.items() if not isinstance(a, str) and a.role == "leader"]
    if if_leader and not leading:
        answer = answers[targets[0]]
        role = answer.role if not isinstance(answer, str) else "unknown"
        _say(as_json, {"switched": False, "reason": f"{targets[0]} is {role}, not the leader"})
        return
    if not leading:
        roles = ", ".join(f"{t}: {a if isinstance(a, str) else a.role}" for t, a in answers.items())
        raise CommandError(f"no replica leads now ({roles}); nothing to switch over")
    target = leading[0]
    old = answers[target]
    assert not isinstance(old, str)
    connection = state.connection()
    stub = pb_grpc.CommitLogStub(connection.channel(target))
    try:
        done: pb.SwitchoverResponse = stub.Switchover(
            pb.SwitchoverRequest(to=successor, timeout_ms=int(timeout_s * 1000)),
            timeout=timeout_s + SWITCHOVER_CALL_SLACK_S,
            metadata=connection.metadata,
        )
    except grpc.RpcError as err:
        raise as_command_error(from_rpc_error(err, "CommitLog/Switchover")) from err
    _say(
        as_json,
        {
            "switched": True,
            "from": old.replica,
            "to": done.leader,
            "leader_address": done.leader_address,
            "epoch": done.epoch,
            "writes_paused_ms": round(done.writes_paused_ms, 1),
        },
    )


def _say(as_json: bool, result: dict[str, Any]) -> None:
    if as_json:
        echo_json(result)
    elif not result["switched"]:
        stdout_console().print(f"nothing to do: {result['reason']}")
    else:
        stdout_console().print(
            f"{result['to']} ({result['leader_address']}) leads in epoch {result['epoch']}, "
            f"handed over by {result['from']}; writes paused {result['writes_paused_ms']} ms"
        )
