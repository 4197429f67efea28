"""Shared fixtures: a tiny local model, a real S3-compatible server on loopback, Prefect's test API."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

import pytest

from tests.requirements import need

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


# moto's HTTP server logs every request at INFO; keep test output readable
logging.getLogger("werkzeug").setLevel(logging.WARNING)


@pytest.fixture(autouse=True)
def cli_settings_end_with_the_test():
    """The environment as it was before the test.

    A command run in-process (typer's CliRunner) sets its run's console settings in the process
    environment, as the CLI does for itself (``PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL``, Dask's logging,
    the libraries' progress bars): in pytest's process they would outlive the test and reach every later
    test's subprocesses, so ``--verbose`` there would find Prefect already quieted.
    """
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def shared_data(name: str) -> Path:
    """A folder of ../shared/data; skip where absent, but fail on CI where it must be present."""
    path = SHARED_DATA / name
    need(str(path), path.exists(), "not present (clone the repository beside ../shared to run this test)")
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A deterministic tiny sentence-transformers model, built locally (no hub)."""
    from tests.builders import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-st") / "tiny", kind="sentence-transformers")


@pytest.fixture(scope="session")
def tiny_hf_model_dir(tmp_path_factory) -> Path:
    """A deterministic tiny plain-transformers model (mean pooling configured by the spec)."""
    from tests.builders import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-hf") / "tiny-hf", kind="transformers")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_server():
    """moto in server mode on loopback: a real HTTP S3 endpoint, as s3fs's own suite uses."""
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    yield endpoint
    server.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """Environment for an s3:// root on the loopback server, with a fresh bucket per test."""
    import uuid

    import s3fs

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing-key-id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    bucket = f"bucket-{uuid.uuid4().hex[:10]}"
    fs = s3fs.S3FileSystem(endpoint_url=s3_server, key="testing-key-id", secret="testing-secret")
    fs.mkdir(bucket)
    return f"s3://{bucket}/normaudit"


@pytest.fixture(scope="session")
def prefect_api():
    """A temporary Prefect API for the session (real flows, throwaway database)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
