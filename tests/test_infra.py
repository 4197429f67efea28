"""infra/ files parse, and the services, ports and variables they name match what normaudit reads.

No Docker engine or Kubernetes runs here: these checks stand in for `docker compose config`
and `kubectl apply --dry-run` on what can be checked offline.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from pipeline.settings import Settings

INFRA = Path(__file__).resolve().parents[1] / "infra"
AWS_VARS = {"AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"}


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _compose() -> dict:
    return _docs(INFRA / "compose.yaml")[0]


def _env_names(obj) -> set[str]:
    """Every environment variable name set anywhere in a parsed manifest."""
    names = set()
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key in ("environment", "data", "stringData") and isinstance(value, dict):
                names |= set(value)
            if key == "env" and isinstance(value, list):
                names |= {e["name"] for e in value if isinstance(e, dict) and "name" in e}
            names |= _env_names(value)
    elif isinstance(obj, list):
        for v in obj:
            names |= _env_names(v)
    return {n for n in names if re.fullmatch(r"[A-Z][A-Z0-9_]+", n)}


def _normaudit_env_is_read(names: set[str]) -> None:
    fields = {f"NORMAUDIT_{f.upper()}" for f in Settings.model_fields}
    unknown = {n for n in names if n.startswith("NORMAUDIT_")} - fields
    assert not unknown, f"variables normaudit does not read: {unknown}"


@pytest.mark.parametrize("path", sorted(INFRA.rglob("*.yaml")), ids=lambda p: p.name)
def test_every_file_parses(path):
    assert _docs(path), path


def test_compose_services_ports_and_env_match_settings(monkeypatch):
    compose = _compose()
    services = compose["services"]
    assert {"prefect-server", "prefect-worker", "dask-scheduler", "dask-worker", "minio",
            "minio-create-bucket"} <= set(services)
    env = services["dask-worker"]["environment"]
    _normaudit_env_is_read(_env_names(compose))
    assert set(env) >= AWS_VARS
    # the addresses normaudit is given point at the services and ports that are started
    dask = urlparse(env["NORMAUDIT_DASK_ADDRESS"])
    assert dask.hostname == "dask-scheduler" and f"--port {dask.port}" in services["dask-scheduler"]["command"]
    api = urlparse(env["PREFECT_API_URL"])
    assert api.hostname == "prefect-server" and f"--port {api.port}" in services["prefect-server"]["command"]
    s3 = urlparse(env["AWS_ENDPOINT_URL"])
    assert s3.hostname == "minio" and f"{s3.port}:{s3.port}" in services["minio"]["ports"]
    bucket = urlparse(env["NORMAUDIT_ROOT"]).netloc
    assert f"local/{bucket}" in services["minio-create-bucket"]["entrypoint"]
    assert env["AWS_ACCESS_KEY_ID"] == services["minio"]["environment"]["MINIO_ROOT_USER"]
    # GPU workers: a device reservation and a GPU resource the embedding tasks are annotated with
    worker = services["dask-worker"]
    assert worker["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert "--resources GPU=1" in worker["command"] and "--preload pipeline.embedding.warmup" in worker["command"]
    # and normaudit's settings accept exactly this environment
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    s = Settings()
    assert s.root == env["NORMAUDIT_ROOT"] and s.dask_address == env["NORMAUDIT_DASK_ADDRESS"]
    assert s.device == "cuda" and s.storage_options()["endpoint_url"] == env["AWS_ENDPOINT_URL"]


def test_k8s_manifests_agree_with_each_other():
    docs = [d for p in sorted((INFRA / "k8s").glob("*.yaml")) for d in _docs(p)]
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("DaskCluster", "normaudit-dask") in kinds
    assert {("Deployment", "prefect-worker"), ("Deployment", "minio"), ("Service", "minio"),
            ("Service", "prefect-server")} <= kinds
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    secret = next(d for d in docs if d["kind"] == "Secret")["stringData"]
    _normaudit_env_is_read(set(config) | set(secret))
    assert set(config) | set(secret) >= AWS_VARS
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    for var, svc in (("AWS_ENDPOINT_URL", "minio"), ("PREFECT_API_URL", "prefect-server")):
        url = urlparse(config[var])
        assert url.hostname.split(".")[0] == svc
        assert url.port in {p["port"] for p in services[svc]["spec"]["ports"]}
    cluster = next(d for d in docs if d["kind"] == "DaskCluster")
    dask = urlparse(config["NORMAUDIT_DASK_ADDRESS"])
    # the operator names the scheduler service <cluster>-scheduler
    assert dask.hostname.split(".")[0] == f"{cluster['metadata']['name']}-scheduler"
    assert dask.port in {p["port"] for p in cluster["spec"]["scheduler"]["service"]["ports"]}
    worker = cluster["spec"]["worker"]["spec"]["containers"][0]
    assert "GPU=1" in worker["args"] and worker["resources"]["limits"]["nvidia.com/gpu"] == 1
    refs = {r.get("configMapRef", r.get("secretRef"))["name"] for r in worker["envFrom"]}
    assert refs == {"normaudit-env", "normaudit-s3"}


def test_prefect_yaml_entrypoints_are_flows():
    from prefect import Flow

    for dep in _docs(INFRA / "prefect.yaml")[0]["deployments"]:
        path, func = dep["entrypoint"].split(":")
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        flow = getattr(module, func)
        assert isinstance(flow, Flow), dep["entrypoint"]
        # parameters name only arguments the flow takes
        assert set(dep["parameters"]) <= set(flow.parameters.properties), dep["name"]


def test_dockerfile_copies_existing_paths():
    repo = INFRA.parent
    for line in (INFRA / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            for src in line.split()[1:-1]:
                assert (repo / src).exists(), src
