"""`mqstore produce`: send messages from arguments, a file, stdin, or a generated load.

    mqstore produce TOPIC BODY...              one message per argument
    mqstore produce TOPIC - | --file F         one message per line (--whole: the file is one)
    mqstore produce TOPIC --count N --size B   N generated messages, a progress bar, a summary

Everything goes through one Producer (batched, pipelined, idempotent). Results print in the
order the messages were given, as they arrive; the first message the store refuses ends the
command with its error (exit 1, or 3 when the store cannot be reached).
"""

from __future__ import annotations

import dataclasses
import os
import random
import string
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator
from typing import IO, Any, Final, Protocol

import click

from mqstore.cli.options import CliState, echo_json, json_option, pass_state
from mqstore.cli.progress import Reporter
from mqstore.client.compression import Compression
from mqstore.client.producer import Producer, SendResult

# Futures held before the oldest is waited for: bounds memory when a million lines stream in,
# while keeping far more in flight than one batch (1,000) times the window (4).
IN_FLIGHT_MESSAGES_MAX: Final = 20_000
LOAD_SIZE_BYTES_DEFAULT: Final = 100
# Load bodies are random letters and digits, as Kafka's producer-perf-test makes them: text a
# person can read back, which compresses about as much as real text does.
_LOAD_ALPHABET: Final = string.ascii_letters + string.digits


class _Pending(Protocol):
    """What a send returns: a future-like result (the Producer's own future type)."""

    def done(self) -> bool: ...

    def result(self, timeout: float | None = None) -> SendResult: ...


def _parse_properties(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{item!r} is not NAME=VALUE", ctx, param)
        out[name] = value
    return out


def _lines(f: IO[bytes]) -> Iterator[bytes]:
    """Lines without their end ("\\n" or "\\r\\n"); an empty line is an empty message."""
    for line in f:
        end = len(line)
        if line.endswith(b"\n"):
            end -= 2 if line.endswith(b"\r\n") else 1
        yield line[:end]


def _result_fields(r: SendResult) -> dict[str, Any]:
    return dataclasses.asdict(r)


def _result_line(r: SendResult) -> str:
    dup = "  duplicate" if r.duplicate else ""
    return (
        f"queue={r.queue_id} offset={r.queue_offset} msg_id={r.msg_id} uniq_key={r.uniq_key}{dup}"
    )


@click.command("produce")
@click.argument("topic")
@click.argument("bodies", nargs=-1, metavar="[BODY]...")
@click.option(
    "--file",
    "file",
    type=click.File("rb"),
    metavar="FILE",
    help="send each line of FILE as a message ('-': stdin)",
)
@click.option("--whole", is_flag=True, help="with --file: the whole file is one message")
@click.option(
    "--count",
    "-n",
    type=click.IntRange(min=1),
    metavar="N",
    help="load mode: send N messages (BODY repeated, or --size random ones) and sum up",
)
@click.option(
    "--size",
    type=click.IntRange(min=0),
    metavar="BYTES",
    help=f"with --count: body size of the generated messages [default {LOAD_SIZE_BYTES_DEFAULT}]",
)
@click.option("--key", "-k", help="message key (KEYS): findable with `mqstore query key`")
@click.option("--tags", "-t", default="", help="message tag (TAGS)")
@click.option(
    "--queue",
    "-q",
    "queue_id",
    type=click.IntRange(min=0),
    metavar="Q",
    help="queue id; default: by the key's hash, else round robin over 4 queues",
)
@click.option(
    "--property",
    "-p",
    "properties",
    multiple=True,
    metavar="NAME=VALUE",
    callback=_parse_properties,
    help="a user property; repeat for more",
)
@click.option(
    "--compression",
    type=click.Choice([c.value for c in Compression]),
    default=Compression.ZLIB.value,
    show_default=True,
    help="how bodies over 4 KiB are compressed",
)
@json_option
@pass_state
def produce(
    state: CliState,
    topic: str,
    bodies: tuple[str, ...],
    file: IO[bytes] | None,
    whole: bool,
    count: int | None,
    size: int | None,
    key: str | None,
    tags: str,
    queue_id: int | None,
    properties: dict[str, str],
    compression: str,
    as_json: bool,
) -> None:
    """Send messages to TOPIC: each BODY, each line of a file or stdin, or a load.

    Prints one line per message (queue, queue offset, message id, unique id) once the store
    has it; in load mode a progress bar on stderr and a summary at the end.

    \b
    Examples:
      mqstore produce orders '{"id": 42}' --key order-42 --tags created
      tail -f app.log | mqstore produce logs -
      mqstore produce orders --file orders.jsonl --json
      mqstore produce bench --count 100000 --size 1024
    """
    stdin_lines = bodies == ("-",)
    if whole and file is None:
        raise click.UsageError("--whole needs --file")
    if size is not None and count is None:
        raise click.UsageError("--size needs --count")
    if count is not None and (file is not None or stdin_lines):
        raise click.UsageError("--count repeats a BODY or generates bodies; not with a file")
    if count is not None and (len(bodies) > 1 or (bodies and size is not None)):
        raise click.UsageError("--count takes at most one BODY, or --size, not both")
    if file is not None and bodies:
        raise click.UsageError("give BODY arguments or --file, not both")
    if not bodies and file is None and count is None:
        raise click.UsageError("nothing to send: give BODY..., - (stdin), --file F or --count N")

    options: dict[str, Any] = {"tags": tags, "queue_id": queue_id, "properties": properties}
    if key:
        options["key"] = key
    settings = state.settings()
    producer = Producer(
        state.connection(),
        compression=Compression(compression),
        # A command gives up when its timeout says so, not after the SDK's 30 s of retries.
        retry_timeout_s=settings.timeout_s,
    )
    with producer:
        if count is not None:
            body = os.fsencode(bodies[0]) if bodies else _random_body(size)
            _load(producer, topic, body, count, options, as_json)
            return
        if file is not None:
            source: Iterable[bytes] = [file.read()] if whole else _lines(file)
            interactive = file.isatty()
        elif stdin_lines:
            source = _lines(sys.stdin.buffer)
            interactive = sys.stdin.isatty()
        else:
            # The argument's bytes as given, even when they are not valid UTF-8.
            source = (os.fsencode(b) for b in bodies)
            interactive = False
        _send_all(producer, topic, source, options, as_json, interactive)


def _random_body(size: int | None) -> bytes:
    n = LOAD_SIZE_BYTES_DEFAULT if size is None else size
    return "".join(random.choices(_LOAD_ALPHABET, k=n)).encode("ascii")


def _send_all(
    producer: Producer,
    topic: str,
    source: Iterable[bytes],
    options: dict[str, Any],
    as_json: bool,
    interactive: bool,
) -> None:
    """Send in order, print results in order as they arrive (at once for a person typing)."""

    def show(r: SendResult) -> None:
        if as_json:
            echo_json(_result_fields(r))
        else:
            click.echo(_result_line(r))

    pending: deque[_Pending] = deque()
    for body in source:
        if interactive:
            show(producer.send_sync(topic, body, **options))
            continue
        pending.append(producer.send(topic, body, **options))
        while pending and (pending[0].done() or len(pending) >= IN_FLIGHT_MESSAGES_MAX):
            show(pending.popleft().result())
    producer.flush()
    while pending:
        show(pending.popleft().result())


def _load(
    producer: Producer,
    topic: str,
    body: bytes,
    count: int,
    options: dict[str, Any],
    as_json: bool,
) -> None:
    pending: deque[_Pending] = deque()
    started = time.perf_counter()
    with Reporter("sent", total=count, unit="messages") as progress:
        for _ in range(count):
            pending.append(producer.send(topic, body, **options))
            while pending and (pending[0].done() or len(pending) >= IN_FLIGHT_MESSAGES_MAX):
                pending.popleft().result()  # raises the first failure
                progress.advance()
        producer.flush()
        while pending:
            pending.popleft().result()
            progress.advance()
    seconds = time.perf_counter() - started
    total_bytes = count * len(body)
    summary = {
        "topic": topic,
        "messages": count,
        "bytes": total_bytes,
        "seconds": round(seconds, 3),
        "messages_per_s": round(count / seconds, 1) if seconds > 0 else None,
        "bytes_per_s": round(total_bytes / seconds, 1) if seconds > 0 else None,
        "retries": producer.stats.retries,
    }
    if as_json:
        echo_json(summary)
        return
    rate = count / seconds if seconds > 0 else float("inf")
    mib_s = total_bytes / seconds / (1 << 20) if seconds > 0 else float("inf")
    click.echo(
        f"sent {count} messages, {total_bytes} bytes to {topic} in {seconds:.2f} s: "
        f"{rate:,.0f} msg/s, {mib_s:.2f} MiB/s"
    )
