"""The SDK's pure parts: compression marks, typed errors, settings from the environment."""

from __future__ import annotations

import os
import zlib

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqstore import errors as domain
from mqstore.client import errors
from mqstore.client.compression import Compression, compress, compression_of, decompress
from mqstore.client.producer import SendFuture, SendResult
from mqstore.client.settings import ClientSettings, TlsSettings
from mqstore.formats import sysflag


@given(body=st.binary(max_size=5_000), kind=st.sampled_from(list(Compression)))
def test_compress_then_decompress_gives_the_body_back(body: bytes, kind: Compression) -> None:
    stored, flags = compress(body, kind)
    assert decompress(stored, flags) == body
    assert len(stored) <= len(body)  # never stored bigger than given
    assert (flags == 0) == (stored == body)


@pytest.mark.parametrize(
    ("kind", "bits"),
    [
        (Compression.ZLIB, 0x300),
        (Compression.LZ4, 0x100),
        (Compression.ZSTD, 0x200),
    ],
)
def test_the_sysflag_marks_are_rocketmqs(kind: Compression, bits: int) -> None:
    _, flags = compress(b"a" * 10_000, kind)
    assert flags == sysflag.COMPRESSED | bits
    assert compression_of(flags) is kind


def test_a_body_marked_compressed_without_a_type_is_zlib_as_older_rocketmq_wrote() -> None:
    body = b"old style " * 100
    assert decompress(zlib.compress(body), sysflag.COMPRESSED) == body


@pytest.mark.parametrize("kind", [Compression.ZLIB, Compression.LZ4, Compression.ZSTD])
def test_a_damaged_compressed_body_is_data_loss_not_garbage(kind: Compression) -> None:
    stored, flags = compress(b"payload " * 1_000, kind)
    with pytest.raises(errors.DataLoss):
        decompress(stored[: len(stored) // 2], flags)
    with pytest.raises(errors.DataLoss):
        decompress(os.urandom(64), flags)


def test_unknown_compression_bits_are_data_loss() -> None:
    with pytest.raises(errors.DataLoss, match="unknown compression"):
        decompress(b"x", sysflag.COMPRESSED | 0x500)


@pytest.mark.parametrize("kind", [Compression.ZLIB, Compression.LZ4, Compression.ZSTD])
def test_a_compression_bomb_stops_at_the_limit(kind: Compression) -> None:
    bomb, flags = compress(b"\0" * (80 << 20), kind)
    with pytest.raises(errors.DataLoss, match="limit"):
        decompress(bomb, flags)


@pytest.mark.parametrize(
    ("code", "cls", "domain_cls"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, errors.InvalidArgument, domain.InvalidArgument),
        (grpc.StatusCode.NOT_FOUND, errors.NotFound, domain.NotFound),
        (grpc.StatusCode.OUT_OF_RANGE, errors.OutOfRange, domain.OutOfRange),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, errors.ResourceExhausted, domain.ResourceExhausted),
        (grpc.StatusCode.UNAVAILABLE, errors.Unavailable, domain.Unavailable),
        (grpc.StatusCode.DATA_LOSS, errors.DataLoss, domain.DataLoss),
        (grpc.StatusCode.UNAUTHENTICATED, errors.Unauthenticated, domain.Unauthenticated),
        (grpc.StatusCode.PERMISSION_DENIED, errors.PermissionDenied, domain.PermissionDenied),
        (grpc.StatusCode.UNIMPLEMENTED, errors.Internal, errors.ClientError),
    ],
)
def test_each_status_has_its_exception_caught_as_the_domain_error_too(
    code: grpc.StatusCode, cls: type, domain_cls: type
) -> None:
    err = errors.error_for(code, "it failed", field="topic", method="CommitLog/Append")
    assert type(err) is cls and isinstance(err, domain_cls)
    assert err.code is code and err.details == "it failed" and err.field == "topic"
    assert str(err) == f"CommitLog/Append: {code.name}: it failed (field topic)"


def test_a_refused_message_reads_as_the_status_it_amounts_to() -> None:
    full = errors.refusal("CREATE_MAPPED_FILE_FAILED", "disk full: no space")
    assert full.code is grpc.StatusCode.RESOURCE_EXHAUSTED and full.put_status == (
        "CREATE_MAPPED_FILE_FAILED"
    )
    assert errors.refusal("MESSAGE_ILLEGAL", "").code is grpc.StatusCode.INVALID_ARGUMENT
    assert errors.refusal("SERVICE_NOT_AVAILABLE", "").code is grpc.StatusCode.UNAVAILABLE


def test_settings_come_from_the_environment_and_arguments_win(tmp_path) -> None:  # type: ignore[no-untyped-def]
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    env = {
        "MQSTORE_COMMITLOG": "cl:1",
        "MQSTORE_CQ": "cq-0:2, cq-1:2",
        "MQSTORE_INDEX": "ix:3",
        "MQSTORE_TOKEN_FILE": str(token),
        "MQSTORE_TIMEOUT_S": "2.5",
        "MQSTORE_TLS_CA": "/ca.pem",
    }
    s = ClientSettings.from_env(env, commitlog="other:9")
    assert s.commitlog == "other:9" and s.cq == ("cq-0:2", "cq-1:2") and s.index == ("ix:3",)
    assert s.timeout_s == 2.5 and s.tls == TlsSettings(ca_file="/ca.pem")
    assert s.bearer_token() == "s3cret" and "s3cret" not in repr(s)
    assert ClientSettings.from_env({}) == ClientSettings()


@pytest.mark.parametrize(
    "bad",
    [
        {"timeout_s": 0},
        {"commitlog": ""},
        {"cq": "one:1"},
        {"token": "a", "token_file": "/f"},
        # A mistyped address is refused at once, not resolved as a host name seconds later.
        {"commitlog": "notaport"},
        {"commitlog": "a:7100,b"},
        {"cq": ("cq:99999",)},
        {"index": ("ix:",)},
        {"index": ("dns-all:ix",)},
    ],
)
def test_bad_settings_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(domain.InvalidArgument):
        ClientSettings(**bad)  # type: ignore[arg-type]
    ClientSettings(commitlog="[::1]:7100,unix:/run/mq.sock", index=("dns-all:ix:7300",))
    with pytest.raises(domain.InvalidArgument):
        TlsSettings(cert_file="/c.pem")


def test_a_send_future_waits_times_out_and_calls_back_once_resolved() -> None:
    future = SendFuture()
    seen: list[bool] = []
    future.add_done_callback(lambda f: seen.append(f.done()))
    with pytest.raises(TimeoutError):
        future.result(timeout=0.01)
    result = SendResult("T", 0, 1, 2, "ID", "U", 100, 5)
    future._resolve(result, None)
    assert future.result(timeout=0) is result and future.exception() is None
    future.add_done_callback(lambda f: seen.append(f.done()))  # already done: called at once
    assert seen == [True, True]
    failed = SendFuture()
    failed._resolve(None, errors.Unavailable("down"))
    with pytest.raises(errors.Unavailable):
        failed.result()
