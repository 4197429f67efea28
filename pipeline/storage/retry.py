"""The one retry owner for remote storage: capped exponential back-off with full jitter, bounded twice.

Every operation of :class:`~pipeline.storage.store.Store` on a remote root runs through :func:`call`.
Below it, botocore makes one attempt per request and s3fs one try per call (the store configures both,
see ``Store.__init__``); above it, no Prefect task retries storage steps. So in an outage the number of
requests an operation makes is known: at most ``policy.attempts`` times the requests of one attempt.

Default policy (:data:`DEFAULT_POLICY`), per operation:

- at most **10 attempts**;
- before retry *k* (k = 1..9) a sleep drawn uniformly from ``[0, min(5 s, 0.2 s * 2**(k-1)))``
  ("full jitter": many workers retrying a throttled endpoint do not come back in step);
  the sleeps add up to 26.2 s at most, about 13 s on average;
- **no attempt starts later than 60 s** after the first one; a sleep that would end past that budget
  ends the operation instead.

Worst case per operation: 10 attempts, and 60 s plus the length of one attempt. One S3 request is
bounded by s3fs's connect timeout (5 s) and read timeout (15 s between bytes). One attempt is the
requests of one s3fs call, measured against moto: a write 1 (PUT), an exists 1 (HEAD), a read 2
(HEAD + GET), a listing 1 per page, a move 3 or 4 (listing, HEAD, copy, DELETE); in an outage an
attempt stops at its first failed request. aiohttp sends an idempotent request once more when its connection drops
before an answer (a client-session behaviour with no public switch), so under connection resets one
request may reach the server twice: at most 20 requests reach S3 for a write or an exists in an outage,
10 when the outage answers 5xx (both counted in ``tests/test_retry.py``).

Transient, so retried (exception *types*, plus the status or error code S3 answered):
timeouts (``TimeoutError``, which ``asyncio.TimeoutError`` is; botocore ``ReadTimeoutError``,
``ConnectTimeoutError``; aiohttp ``ServerTimeoutError``); dropped or refused connections (``ConnectionError``,
an ``OSError`` whose errno is a network one, botocore ``EndpointConnectionError``, ``ConnectionClosedError``
and the other ``HTTPClientError``; aiohttp ``ClientConnectionError``, ``ClientPayloadError``); a truncated or
garbled answer (botocore ``IncompleteReadError``, ``ResponseParserError``: S3 is known to send broken XML
while it throttles); and a service answer of 500, 502, 503, 504 or 429, or an error code that means
throttling or a timeout (``SlowDown``, ``Throttling``, ``RequestTimeout``, ``ServiceUnavailable``,
``InternalError``, ...; botocore's own lists), whether botocore's ``ClientError`` arrives as is or translated
by s3fs (``s3fs.errors.translate_boto_error`` turns it into an ``OSError`` whose ``__cause__`` it is).

Never retried: a missing object or bucket, a refused permission, an object that already exists, bad input,
a certificate failure, any other 4xx answer, and any error the list above does not name.

One path is out of the store's reach: DuckDB reads committed parts through a filesystem of its own
(``Store.query_fs``), whose requests keep botocore's standard retries (at most 5 attempts each).
"""

from __future__ import annotations

import errno
import functools
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

# botocore's standard retry mode (botocore.retries.standard) judges answers with these lists too
TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})
TRANSIENT_CODES = frozenset({
    "RequestTimeout", "RequestTimeoutException", "PriorRequestNotComplete",  # timeouts
    "InternalError", "ServiceUnavailable", "Throttling", "ThrottlingException", "ThrottledException",
    "RequestThrottledException", "TooManyRequestsException", "ProvisionedThroughputExceededException",
    "TransactionInProgressException", "RequestLimitExceeded", "BandwidthLimitExceeded",
    "LimitExceededException", "RequestThrottled", "SlowDown", "EC2ThrottledException",
})
NETWORK_ERRNOS = frozenset({errno.ECONNRESET, errno.ECONNABORTED, errno.ECONNREFUSED, errno.EPIPE,
                            errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ENETDOWN,
                            errno.EAGAIN})
_NEVER = (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError, NotADirectoryError)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long one storage operation is tried (see the module docstring)."""

    attempts: int = 10
    first_delay_s: float = 0.2
    max_delay_s: float = 5.0
    budget_s: float = 60.0

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.first_delay_s < 0 or self.max_delay_s < 0 or self.budget_s < 0:
            raise ValueError(f"invalid retry policy {self}: attempts must be >= 1 and times >= 0")

    def delay(self, retry: int) -> float:
        """The sleep before retry number ``retry`` (1 = the second attempt): full jitter under a cap."""
        return random.uniform(0, min(self.max_delay_s, self.first_delay_s * 2 ** (retry - 1)))


DEFAULT_POLICY = RetryPolicy()
# the pre-flight write check: ride out a blip, but tell a user with a wrong endpoint within a second or two
PREFLIGHT_POLICY = RetryPolicy(attempts=3)


class GaveUp(Exception):
    """Raised by :func:`call` when the attempts or the time budget ran out; ``last`` is the last error."""

    def __init__(self, what: str, attempts: int, elapsed_s: float, last: BaseException):
        super().__init__(f"{what}: {attempts} attempts in {elapsed_s:.1f} s, last error {describe(last)}")
        self.what, self.attempts, self.elapsed_s, self.last = what, attempts, elapsed_s, last


def call(fn: Callable[[], T], what: str, policy: RetryPolicy = DEFAULT_POLICY) -> T:
    """Return ``fn()``, retrying transient errors under ``policy``.

    A non-transient error is raised as is, at once. When the attempts or the budget run out,
    :class:`GaveUp` is raised from the last error. An operation that needed more than one attempt
    logs exactly one warning, when it finally succeeds or fails, naming ``what``, the attempts and
    the last error: one line per operation, never one per attempt.
    """
    start = time.monotonic()
    last: BaseException | None = None
    attempt = 0
    while True:
        attempt += 1
        try:
            result = fn()
        except Exception as exc:  # noqa: BLE001 - classified just below; anything else is raised unchanged
            last = exc
            if not is_transient(exc):
                if attempt > 1:
                    _log_once(what, "failed", attempt, start, exc)
                raise
        else:
            if attempt > 1:
                _log_once(what, "succeeded", attempt, start, last)
            return result
        if attempt >= policy.attempts:
            break
        pause = policy.delay(attempt)
        if time.monotonic() - start + pause > policy.budget_s:
            break  # the next attempt would start past the budget
        time.sleep(pause)
    elapsed = time.monotonic() - start
    _log_once(what, "failed", attempt, start, last)
    raise GaveUp(what, attempt, elapsed, last) from last


def _log_once(what: str, outcome: str, attempts: int, start: float, last: BaseException | None) -> None:
    log.warning("storage: %s %s after %d attempts in %.1f s (last error: %s)", what, outcome, attempts,
                time.monotonic() - start, describe(last))


def describe(exc: BaseException | None) -> str:
    """``Type: message`` of an error, with the S3 error code and status when there is one."""
    if exc is None:
        return "none"
    client = _client_error(exc)
    detail = ""
    if client is not None:
        status, code = _status_and_code(client)
        detail = f" [S3 {code or '?'}, HTTP {status or '?'}]"
    return f"{type(exc).__name__}: {exc}{detail}".strip()


def is_transient(exc: BaseException) -> bool:
    """True for the errors worth retrying (see the module docstring for the list)."""
    if isinstance(exc, _NEVER):
        return False
    client = _client_error(exc)
    if client is not None:  # the service answered: its status and code say whether it may heal
        status, code = _status_and_code(client)
        return status in TRANSIENT_STATUS or code in TRANSIENT_CODES
    kinds = _transport_types()
    if isinstance(exc, kinds["never"]):
        return False
    if isinstance(exc, kinds["transient"]):
        return True
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return True
    return isinstance(exc, OSError) and exc.errno in NETWORK_ERRNOS


def _client_error(exc: BaseException) -> Any:
    """The botocore ``ClientError`` behind ``exc`` (itself, or the one s3fs translated), else None."""
    client_error = _transport_types()["client"]
    # s3fs sets the translated error's __cause__, except where it translates with set_cause=False inside
    # ``except ClientError`` (its info/listing calls): then the ClientError is the implicit __context__
    for candidate in (exc, exc.__cause__, exc.__context__ if isinstance(exc, OSError) else None):
        if isinstance(candidate, client_error):
            return candidate
    return None


def _status_and_code(client_error: Any) -> tuple[int | None, str | None]:
    response = getattr(client_error, "response", None) or {}
    status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    return status, (response.get("Error") or {}).get("Code")


@functools.cache
def _transport_types() -> dict[str, Any]:
    # Imported on first use, not at module top: aiohttp takes about 1 s to import (measured on the 2-core
    # dev box) and a local root never needs it; on a remote root s3fs has imported both already.
    import aiohttp
    from botocore import exceptions as boto
    from botocore.parsers import ResponseParserError

    return {
        "client": boto.ClientError,
        "never": (boto.SSLError, aiohttp.ClientSSLError),  # a certificate problem does not heal by waiting
        "transient": (
            boto.ReadTimeoutError, boto.ConnectTimeoutError, boto.EndpointConnectionError,
            boto.ConnectionClosedError, boto.ConnectionError, boto.HTTPClientError, boto.IncompleteReadError,
            ResponseParserError, aiohttp.ServerTimeoutError, aiohttp.ClientConnectionError,
            aiohttp.ClientPayloadError,
        ),
    }
