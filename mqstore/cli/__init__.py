"""The `mqstore` command.

    mqstore up                         run the store (all three services) on this machine
    mqstore log dump|verify DIR        offline tools over commit-log files

Each group is a noun, each command a verb (`mqstore <noun> <verb>`), so later tools slot in.
Exit codes: 0 success; 1 the data or the store failed a check; 2 usage errors.
"""

from __future__ import annotations

import click

from mqstore.cli.log import log_group
from mqstore.cli.up import up


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """mqstore: a persistent message store in the design of RocketMQ's broker store.

    \b
    Start here:
      mqstore up                    run the store on ./data
      mqstore log verify DIR        check a commit-log directory offline
    """


cli.add_command(up)
cli.add_command(log_group)


def main() -> None:
    """Entry point of the `mqstore` script and of `python -m mqstore.cli`."""
    cli(prog_name="mqstore")
