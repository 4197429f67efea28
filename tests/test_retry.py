"""The store is the one retry owner: an outage costs a bounded number of requests and one log line per operation.

moto's S3 server on loopback behind the fault proxy (tests/faultproxy.py): the proxy counts every request
that reaches it, so the attempts of an operation are counted where the storage would see them.
"""

from __future__ import annotations

import errno
import logging
import pickle

import aiohttp
import numpy as np
import pytest
import s3fs
from botocore import exceptions as boto
from botocore.parsers import ResponseParserError
from s3fs.errors import translate_boto_error

from pipeline.settings import load_settings
from pipeline.storage.catalog import open_catalog
from pipeline.storage.retry import DEFAULT_POLICY, PREFLIGHT_POLICY, RetryPolicy, is_transient
from pipeline.storage.store import StorageError, StorageUnavailableError, Store, open_store
from pipeline.storage.verify import verify_root
from tests.faultproxy import FaultProxy
from tests.helpers import store_synthetic, word_probe_set

RETRY_LOGGER = "pipeline.storage.retry"
# aiohttp sends an idempotent request once more when the connection drops before an answer (a behaviour of
# its client session with no public switch), so under connection resets one attempt may reach S3 twice
RESENDS = {"error503": 1, "error500": 1, "reset": 2}


@pytest.fixture
def proxied(s3_server, s3_env, monkeypatch):
    """An S3 root reached through the fault proxy (faults off until a test asks), and the proxy."""
    proxy = FaultProxy(s3_server).start()
    proxy.enabled = False
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    store = open_store(load_settings(root=s3_env))
    store.write_bytes_atomic("warm.json", b"{}")  # the connection pool is warm, the bucket known
    proxy.stats.clear()
    yield store, proxy
    proxy.stop()


def _retry_lines(caplog, what: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == RETRY_LOGGER and what in r.getMessage()]


@pytest.mark.parametrize(("fate", "operation", "what"), [
    ("error503", lambda store: store.write_bytes_atomic("runs/r1.json", b"{}"), "write runs/r1.json"),
    ("reset", lambda store: store.read_bytes("warm.json"), "read warm.json"),
    ("error500", lambda store: store.move("warm.json", "final/warm.json"), "move warm.json"),
])
def test_an_outage_longer_than_the_budget_is_bounded_named_and_logged_once(proxied, caplog, fate, operation, what):
    store, proxy = proxied
    if fate == "reset":  # a store sent to a Dask worker keeps its single-attempt filesystem
        store = pickle.loads(pickle.dumps(store))
    caplog.set_level(logging.WARNING, logger=RETRY_LOGGER)
    proxy.outage(fate)  # lasts until the operation gave up: longer than any budget
    with pytest.raises(StorageUnavailableError) as raised:
        operation(store)
    proxy.outage(None)
    attempts = DEFAULT_POLICY.attempts
    # no layer below the store retries: each attempt stops at its first failed request
    assert attempts <= proxy.stats["requests"] <= attempts * RESENDS[fate], proxy.stats
    message = str(raised.value)
    assert f"{what} failed {attempts} times" in message, message
    assert store.root_url in message and "run the same command again" in message and "check it" in message
    lines = _retry_lines(caplog, what)
    assert len(lines) == 1 and f"failed after {attempts} attempts" in lines[0], lines


def test_the_time_budget_ends_an_outage_before_the_attempts_run_out(proxied, caplog):
    store, proxy = proxied
    patient = Store(store.root_url, store.storage_options, RetryPolicy(attempts=1000, first_delay_s=0.05,
                                                                      max_delay_s=0.1, budget_s=1.0))
    caplog.set_level(logging.WARNING, logger=RETRY_LOGGER)
    proxy.outage("error503")
    with pytest.raises(StorageUnavailableError, match=r"read warm\.json failed \d+ times") as raised:
        patient.read_bytes("warm.json")
    proxy.outage(None)
    tried = proxy.stats["requests"]
    assert 1 < tried < 1000 and f"failed {tried} times" in str(raised.value)
    assert len(_retry_lines(caplog, "read warm.json")) == 1


def test_an_outage_shorter_than_the_budget_loses_no_rows_and_logs_one_line(proxied, caplog):
    store, proxy = proxied
    caplog.set_level(logging.WARNING, logger=RETRY_LOGGER)
    # 6 failed requests in a row, then the endpoint is back: fewer than the attempts of one operation
    proxy.force(["error503", "reset", "error500", "error503", "reset", "error503"])
    n = 30
    store_synthetic(store, "m", "r", word_probe_set("w", n, {"zipf": np.ones(n)}), np.linspace(1, 2, n),
                    shard_size=10)
    assert proxy.stats["error503"] == 3 and proxy.stats["reset"] == 2 and proxy.stats["error500"] == 1
    lines = [r.getMessage() for r in caplog.records if r.name == RETRY_LOGGER]
    assert len(lines) == 1 and "succeeded after" in lines[0], lines  # the one operation that met the outage
    rows = open_catalog(store).execute("select count(*), count(distinct item_id) from embeddings").fetchall()
    assert rows == [(n, n)]
    report = verify_root(store, "sha256")
    assert report.ok and report.parts == 3, report.problems


@pytest.mark.parametrize(("fate", "error"), [("error403", PermissionError), ("error400", OSError)])
def test_errors_that_cannot_heal_are_raised_at_once(proxied, caplog, fate, error):
    store, proxy = proxied
    caplog.set_level(logging.WARNING, logger=RETRY_LOGGER)
    proxy.force([fate])
    with pytest.raises(error) as raised:
        store.write_bytes_atomic("runs/r2.json", b"{}")
    assert not isinstance(raised.value, StorageError)
    assert proxy.stats["requests"] == 1 and not _retry_lines(caplog, "runs/r2.json")
    with pytest.raises(FileNotFoundError):
        store.read_bytes("no/such/object.json")
    assert proxy.stats["requests"] <= 1 + 2  # a missing object costs one attempt (HEAD, then a listing), not ten


def test_the_write_check_gives_up_within_its_short_policy(proxied):
    store, proxy = proxied
    proxy.outage("error503")
    with pytest.raises(StorageError, match=r"cannot write to storage root .* failed 3 times"):
        store.check_writable()
    proxy.outage(None)
    # one attempt of s3fs's makedirs asks S3 up to three times (object, listing, bucket) before it fails
    assert PREFLIGHT_POLICY.attempts == 3 and proxy.stats["requests"] <= 3 * 3


def _client_error(code: str, status: int, op: str = "PutObject") -> boto.ClientError:
    return boto.ClientError({"Error": {"Code": code, "Message": code},
                             "ResponseMetadata": {"HTTPStatusCode": status}}, op)


@pytest.mark.parametrize(("code", "status", "transient"), [
    ("SlowDown", 503, True), ("ServiceUnavailable", 503, True), ("InternalError", 500, True), ("503", 503, True),
    ("Throttling", 400, True), ("RequestTimeout", 400, True), ("TooManyRequestsException", 429, True),
    ("NoSuchKey", 404, False), ("AccessDenied", 403, False), ("InvalidArgument", 400, False),
    ("NotImplemented", 501, False), ("PreconditionFailed", 412, False),
])
def test_service_answers_are_judged_by_status_and_code_as_sent_or_as_s3fs_translates_them(code, status, transient):
    raw = _client_error(code, status)
    assert is_transient(raw) is transient
    assert is_transient(translate_boto_error(raw)) is transient  # OSError / PermissionError / FileNotFoundError
    try:  # as s3fs's info and listings raise it: translated without a cause, inside the ClientError's handler
        try:
            raise raw
        except boto.ClientError as exc:
            raise translate_boto_error(exc, set_cause=False)  # noqa: B904 - s3fs's own way, reproduced
    except Exception as translated:
        assert translated.__cause__ is None and is_transient(translated) is transient


@pytest.mark.parametrize(("exc", "transient"), [
    (TimeoutError(), True),
    (ConnectionResetError(errno.ECONNRESET, "reset"), True),
    (OSError(errno.ECONNRESET, "reset"), True),
    (OSError(errno.EIO, "i/o error"), False),
    (boto.ReadTimeoutError(endpoint_url="http://s3"), True),
    (boto.ConnectTimeoutError(endpoint_url="http://s3"), True),
    (boto.EndpointConnectionError(endpoint_url="http://s3"), True),
    (boto.ConnectionClosedError(endpoint_url="http://s3"), True),
    (ResponseParserError("garbled XML"), True),
    (boto.SSLError(endpoint_url="http://s3", error="certificate verify failed"), False),
    (boto.NoCredentialsError(), False),
    (aiohttp.ServerDisconnectedError(), True),
    (aiohttp.ServerTimeoutError(), True),
    (aiohttp.ClientPayloadError("truncated"), True),
    (FileNotFoundError(errno.ENOENT, "gone"), False),
    (PermissionError(errno.EACCES, "no"), False),
    (ValueError("bad input"), False),
])
def test_transport_errors_are_judged_by_type(exc, transient):
    assert is_transient(exc) is transient


def test_botocore_and_s3fs_make_a_single_attempt_below_the_store(proxied):
    store, _ = proxied
    assert isinstance(store.fs, s3fs.S3FileSystem) and store.fs.retries == 1
    assert store.fs.config_kwargs["retries"] == {"mode": "standard", "total_max_attempts": 1}
    assert store.query_fs is not store.fs and store.query_fs.config_kwargs["retries"]["total_max_attempts"] == 5
