"""`mqstore log repair DIR [--yes]`: make a commit log whose older segment lost its tail end in
that segment, so that commitlog_svc starts again (mqstore/storage/log_repair.py).

Without --yes it only says what it would do and what would be lost. Unlike `dump` and `verify`
it writes: it moves segments, and takes the store's lock to do it, so commitlog_svc must be
stopped (a running one holds the lock: exit 2).

Exit codes: 0 nothing to repair, or repaired; 1 a repair is needed (shown, not done: add
--yes); 2 usage errors (not a commit log's directory, the store is running).
"""

from __future__ import annotations

import click

from mqstore.cli.log import log_group, segments_dir
from mqstore.errors import StoreLocked
from mqstore.storage import log_repair

EXIT_NEEDED = 1


class _Usage(click.ClickException):
    exit_code = 2


@click.command("repair")
@click.argument("directory", metavar="DIR", type=click.Path(exists=True, file_okay=False))
@click.option("--yes", is_flag=True, help="Do it (default: only say what would be done).")
@click.pass_context
def repair(ctx: click.Context, directory: str, yes: bool) -> None:
    """Make the log end in its first short segment that is not the newest.

    DIR is commitlog_svc's data dir (or its commitlog/ directory, or the data dir `mqstore
    up` made). A segment shorter than the
    segment size that is not the newest (a file system that lost its tail, a partial copy)
    makes commitlog_svc refuse to start: the bytes past its end are lost, between records
    that are not. This moves every later segment, and a copy of the damaged one, to
    DIR/commitlog-aside-<UTC time>/; at its next start commitlog_svc treats the damaged
    segment as a torn tail and the log ends after its last whole record. The messages after
    that point are lost to the store (kept in the aside directory, never read). A short
    newest segment needs no repair: commitlog_svc mends it itself.

    \b
    Examples:
      mqstore log repair ./data          what would be done, and lost
      mqstore log repair ./data --yes    do it (commitlog_svc stopped)
    """
    directory = segments_dir(directory)
    try:
        if not yes:
            plan = log_repair.plan(directory)
            for line in plan.describe():
                click.echo(line)
            if plan.needed:
                click.echo("Nothing was changed; run again with --yes to do it.")
                ctx.exit(EXIT_NEEDED)
            return
        done, aside = log_repair.repair(directory)
    except log_repair.RepairError as err:
        raise _Usage(str(err)) from err
    except StoreLocked as err:
        raise _Usage(f"{err}: stop commitlog_svc before repairing its log") from err
    for line in done.describe():
        click.echo(line)
    if aside:
        click.echo(
            f"Repaired: segments moved to {aside}; start commitlog_svc, which ends the log at "
            f"offset {done.end_offset} or before."
        )


log_group.add_command(repair)
