"""Deployment: the compose file (parsed, since docker cannot run here) and Dask TLS end to end."""

from __future__ import annotations

import contextlib
import io
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tensorflow_ooc.cli import main
from tensorflow_ooc.workflow.records import RunStore

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"


def _opt(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_compose_services_commands_volumes():
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    assert {"scheduler", "worker-1", "worker-2", "prometheus", "tfooc"} <= set(services)
    assert "storage" in compose["volumes"]

    sched = services["scheduler"]
    assert sched["build"]["dockerfile"] == "docker/Dockerfile"
    assert (DOCKER / sched["build"]["context"] / sched["build"]["dockerfile"]).resolve() == DOCKER / "Dockerfile"
    assert sched["entrypoint"] == ["dask", "scheduler"]
    cmd = sched["command"]
    assert _opt(cmd, "--preload") == "tensorflow_ooc.monitoring" and _opt(cmd, "--tfooc-storage") == "/data"
    port, dash = _opt(cmd, "--port"), _opt(cmd, "--dashboard-address").rsplit(":", 1)[1]
    assert {f"{port}:{port}", f"{dash}:{dash}"} <= set(sched["ports"])

    for name in ("worker-1", "worker-2"):
        w = services[name]
        assert w["entrypoint"] == ["dask", "worker"] and w["command"][0] == f"tcp://scheduler:{port}"
        assert _opt(w["command"], "--name") == name and "scheduler" in w["depends_on"]
    # one image, every CPU role; every tfooc process sees the same storage root at /data
    for name in ("scheduler", "worker-1", "worker-2", "worker-gpu", "tfooc"):
        s = services[name]
        assert "storage:/data" in s["volumes"] and s["environment"]["TFOOC_STORAGE"] == "/data", name
    assert len({services[n]["image"] for n in ("scheduler", "worker-1", "worker-2", "tfooc")}) == 1
    assert services["tfooc"]["entrypoint"] == ["tfooc"] and services["tfooc"]["profiles"] == ["cli"]

    prom = services["prometheus"]
    assert (
        prom["profiles"] == ["prometheus"] and "./prometheus.yml:/etc/prometheus/prometheus.yml:ro" in prom["volumes"]
    )
    scrape = yaml.safe_load((DOCKER / "prometheus.yml").read_text())["scrape_configs"]
    (job,) = [j for j in scrape if j["job_name"] == "dask-scheduler"]
    assert job["metrics_path"] == "/metrics" and job["static_configs"][0]["targets"] == [f"scheduler:{dash}"]

    # the preload's own options parse as Dask will parse them (click), and dask's CLIs know the rest
    from tensorflow_ooc.monitoring import dask_setup

    argv = cmd[cmd.index("tensorflow_ooc.monitoring") + 1 :]
    assert dask_setup.make_context("dask_setup", list(argv)).params == {"tfooc_storage": ("/data",)}
    for role, command in (("scheduler", cmd[: cmd.index("--preload")]), ("worker", services["worker-1"]["command"])):
        helptext = subprocess.run(
            [sys.executable, "-m", "dask", role, "--help"], capture_output=True, text=True, timeout=60, check=True
        ).stdout
        for opt in (a for a in command if a.startswith("--")):
            assert opt in helptext, f"dask {role} has no option {opt}"

    dockerfile = (DOCKER / "Dockerfile").read_text()
    assert "pip install" in dockerfile and 'ENTRYPOINT ["tfooc"]' in dockerfile and "EXPOSE 8786 8787" in dockerfile
    deps = (ROOT / "pyproject.toml").read_text()
    assert '"bokeh' in deps and '"prometheus_client' in deps  # dashboard and /metrics in the image


def _project_version() -> str:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_compose_every_image_is_built_or_published():
    """On a fresh host ``docker compose up`` must not try to pull an image that only a build makes:
    an image named by a service either has a ``build:`` (a Dockerfile in this repository, and a tag
    that names the package version) or is a published image pinned to a release."""
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    version = _project_version()
    built = {}
    for name, service in compose["services"].items():
        image = service.get("image")
        assert image and ":" in image.rsplit("/", 1)[-1], f"{name}: no image with an explicit tag ({image!r})"
        repo, tag = image.rsplit(":", 1)
        assert tag != "latest", f"{name}: {image} names no release"
        build = service.get("build")
        if build is None:  # published: a registry path, nothing of this repository
            assert not repo.startswith("tfooc"), f"{name}: {image} is this project's and has no build:"
            continue
        dockerfile = (DOCKER / build["context"] / build["dockerfile"]).resolve()
        assert dockerfile.is_file(), f"{name}: {dockerfile} does not exist"
        assert (DOCKER / build["context"]).resolve() == ROOT, name  # the Dockerfiles COPY the package from here
        assert tag == version, f"{name}: {image} should be tagged with the package version {version}"
        built.setdefault(image, set()).add(dockerfile.name)
    # one Dockerfile per tag (two services building one tag from two files would overwrite it)
    assert all(len(files) == 1 for files in built.values()), built
    assert built["tfooc:" + version] == {"Dockerfile"}
    # the GPU service builds from the GPU Dockerfile
    gpu = compose["services"]["worker-gpu"]
    assert gpu["build"]["dockerfile"] == "docker/Dockerfile.gpu" and "gpu" in gpu["profiles"]
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert gpu["entrypoint"] == ["dask", "cuda", "worker"] and gpu["command"][0] == "tcp://scheduler:8786"
    assert "dask-cuda" in (ROOT / "pyproject.toml").read_text()  # in the image: pip install '.[gpu]'
    assert "'.[gpu]'" in (DOCKER / "Dockerfile.gpu").read_text()


SPEC = """\
name: secure
steps:
  generate: {kind: generate, out: t.zarr, shape: [20, 25, 30], nnz: 3000, model: planted, rank: 3, seed: 2}
  decompose: {kind: decompose, input: t.zarr, out: t.cp.zarr, rank: 3, max_iters: 3, tol: 0, seed: 1,
              scheduler: cluster}
"""


def _pem_files(sec, tmp_path: Path, prefix: str) -> tuple[str, str, str]:
    out = []
    for name, text in (("ca", sec.tls_ca_file), ("cert", sec.tls_client_cert), ("key", sec.tls_client_key)):
        p = tmp_path / f"{prefix}-{name}.pem"
        p.write_text(text)
        out.append(str(p))
    return out[0], out[1], out[2]


def test_tls_cluster_runs_workflow_and_refuses_clients_without_certificates(tmp_path, capsys):
    pytest.importorskip("cryptography")
    from distributed import Client, LocalCluster
    from distributed.security import Security

    sec = Security.temporary()  # a fresh CA and certificate, in memory
    ca, cert, key = _pem_files(sec, tmp_path, "cluster")
    spec = tmp_path / "secure.yaml"
    spec.write_text(SPEC)
    root = str(tmp_path / "storage")
    with LocalCluster(
        n_workers=1,
        threads_per_worker=1,
        processes=True,
        protocol="tls://",
        security=sec,
        host="127.0.0.1",
        dashboard_address=None,
    ) as cluster:
        addr = cluster.scheduler_address
        assert addr.startswith("tls://")
        tls = ["--tls-ca-file", ca, "--tls-cert", cert, "--tls-key", key]

        # a foreground run whose CP-ALS runs on the TLS cluster
        assert main(["run", str(spec), "--storage", root, "--scheduler", addr, *tls]) == 0
        capsys.readouterr()
        (rec,) = RunStore(root).list()
        assert rec.state == "done" and rec.cluster == addr
        assert rec.steps["decompose"].metrics["scheduler"] == "dask"

        # a submitted run: the driver is a task on the TLS cluster (options after the command)
        assert main(["submit", str(spec), "--scheduler", addr, "--storage", root, "--force", *tls]) == 0
        run_id = capsys.readouterr().out.strip()
        assert main(["status", run_id, "--storage", root, "--wait", "--timeout", "120"]) == 0
        assert RunStore(root).read(run_id).state == "done"

        # no certificate: the CLI says what to pass, before Dask's own TypeError
        assert main(["submit", str(spec), "--scheduler", addr, "--storage", root]) == 2
        err = capsys.readouterr().err
        assert "--tls-ca-file" in err and "--tls-cert" in err
        assert main(["run", str(spec), "--scheduler", addr, "--tls-ca-file", ca]) == 2
        assert "missing --tls-cert" in capsys.readouterr().err

        # the scheduler refuses a client whose certificate another CA signed ...
        other = Security.temporary()
        stranger = Security(
            tls_ca_file=sec.tls_ca_file,
            tls_client_cert=other.tls_client_cert,
            tls_client_key=other.tls_client_key,
            require_encryption=True,
        )
        with pytest.raises((OSError, TimeoutError)), contextlib.redirect_stderr(io.StringIO()):
            Client(addr, security=stranger, timeout="3s")
        # ... and one with no certificate at all (a bare TLS connection that trusts its CA)
        host, port = addr[len("tls://") :].rsplit(":", 1)
        ctx = ssl.create_default_context(cafile=ca)
        ctx.check_hostname = False
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            try:
                with ctx.wrap_socket(raw) as s:
                    s.sendall(b"\0" * 8)
                    refused = s.recv(1) == b""  # closed without a word
            except (ssl.SSLError, ConnectionError):
                refused = True
        assert refused

        # and a client with the cluster's certificate gets in
        with Client(addr, security=sec, timeout="10s") as c:
            assert c.submit(sum, [1, 2], pure=False).result() == 3
