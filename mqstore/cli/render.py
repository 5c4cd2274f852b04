"""How messages look in a terminal: one line each for streams, a block for a single message.

    0:12  2026-11-21T10:00:00.123+00:00  order-42  {"id": 42, "total": 9.5}

queue:offset, store time (local), keys ("-" when none), then the body as text, cut to
BODY_CHARS_MAX. Control characters print escaped, so that a message never spans two lines or
moves the cursor; a body that is not UTF-8 prints with its undecodable bytes as \\xNN. --json
prints Message.to_json() instead, the whole message exactly.
"""

from __future__ import annotations

from typing import Final

from mqstore.cli.times import format_time_ms
from mqstore.client.message import Message

# A line of queue:offset, a time and a key leaves about this much of a wide terminal.
BODY_CHARS_MAX: Final = 100
ELLIPSIS: Final = "…"

_ESCAPES: Final = {
    **{c: f"\\x{c:02x}" for c in range(0x20)},
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): "\\t",
    0x7F: "\\x7f",
}


_ESCAPES_MULTILINE: Final = {c: e for c, e in _ESCAPES.items() if c not in (ord("\n"), ord("\t"))}


def body_text(
    body: bytes, chars_max: int | None = BODY_CHARS_MAX, *, multiline: bool = False
) -> str:
    """The body as one printable line, at most `chars_max` characters (None: all of it);
    `multiline` keeps its line breaks and tabs."""
    text = body.decode("utf-8", "backslashreplace")
    text = text.translate(_ESCAPES_MULTILINE if multiline else _ESCAPES)
    if chars_max is not None and len(text) > chars_max:
        return text[: chars_max - 1] + ELLIPSIS
    return text


def message_line(m: Message) -> str:
    keys = " ".join(m.keys) or "-"
    return (
        f"{m.queue_id}:{m.queue_offset}  {format_time_ms(m.store_timestamp_ms)}  {keys}  "
        f"{body_text(m.body)}"
    )


def message_block(m: Message) -> str:
    """Every field of one message, one per line, then the whole body."""
    user = {k: v for k, v in m.properties.items() if k not in ("KEYS", "TAGS", "UNIQ_KEY")}
    rows = [
        ("msg_id", m.msg_id),
        ("uniq_key", m.uniq_key or "-"),
        ("topic", m.topic),
        ("queue", f"{m.queue_id} offset {m.queue_offset}"),
        ("commit_log_offset", str(m.commit_log_offset)),
        ("keys", " ".join(m.keys) or "-"),
        ("tags", m.tags or "-"),
        ("stored", f"{format_time_ms(m.store_timestamp_ms)} on {m.store_host}"),
        ("born", f"{format_time_ms(m.born_timestamp_ms)} on {m.born_host}"),
        ("size", f"{m.size} bytes stored, body {len(m.body)} bytes"),
        ("sys_flag", f"{m.sys_flag:#x}"),
        ("reconsume_times", str(m.reconsume_times)),
        *((f"property {k}", v) for k, v in sorted(user.items())),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    lines.append("body:")
    lines.append(body_text(m.body, None, multiline=True))
    return "\n".join(lines)
