"""Deployment: the compose file, the Dockerfiles, .dockerignore, the Kubernetes CronJob and the
systemd unit (parsed, and their names checked against each other, since Docker cannot run here),
the image's entrypoint run in a plain venv built as the Dockerfile builds the image, and Dask TLS
end to end."""

from __future__ import annotations

import configparser
import contextlib
import functools
import importlib.metadata as md
import io
import json
import os
import pickle
import re
import shlex
import shutil
import site
import socket
import ssl
import subprocess
import sys
import tempfile
import tomllib
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
    assert "dask-cuda" in (ROOT / "pyproject.toml").read_text()  # in the image: pip install '.[gpu,...]'
    assert "gpu" in _pip_extras(DOCKER / "Dockerfile.gpu")


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


# --- the images, .dockerignore, Kubernetes and systemd: parsed and checked against each other -------

SCHEDULE = ROOT / "workflows" / "schedule"
DOCKERFILES = {"Dockerfile": DOCKER / "Dockerfile", "Dockerfile.gpu": DOCKER / "Dockerfile.gpu"}
INSTRUCTIONS = {
    "FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME", "USER",
    "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL",
}  # fmt: skip
NUMBA_CACHE = "/cache/numba"


def _instructions(path: Path) -> list[tuple[str, str]]:
    """A Dockerfile's instructions, as Docker reads them: comments dropped, lines continued by a
    backslash joined, each (INSTRUCTION, arguments); an unknown instruction fails."""
    out, pending = [], ""
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, args = line.partition(" ")
        assert word.upper() in INSTRUCTIONS and word == word.upper(), f"{path.name}, line {number}: {word}"
        out.append((word, args.strip()))
    assert not pending, f"{path.name} ends inside a continued line"
    assert out[0][0] in ("FROM", "ARG"), f"{path.name} does not start with FROM"
    return out


def _exec_form(args: str) -> list[str]:

    value = json.loads(args)  # ENTRYPOINT and CMD in exec form: a JSON array of strings
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


def _env(instructions: list[tuple[str, str]]) -> dict[str, str]:

    env = {}
    for word, args in instructions:
        if word == "ENV":
            env.update(kv.split("=", 1) for kv in shlex.split(args))
    return env


def _pip_extras(path: Path) -> set[str]:
    """The package's extras a Dockerfile installs (``pip install '.[a,b]'``)."""

    extras: set[str] = set()
    for word, args in _instructions(path):
        if word == "RUN" and "pip install" in args:
            for found in re.findall(r"\.\[([A-Za-z0-9_,-]+)\]", args):
                extras.update(found.split(","))
    return extras


def _module_of(requirement: str) -> str:
    """The module a requirement installs (its top-level import name)."""

    name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0)
    return _modules_by_distribution().get(name.lower().replace("_", "-"), name.replace("-", "_").lower())


@functools.cache
def _modules_by_distribution() -> dict[str, str]:
    """Installed distribution (normalized name) -> its top-level module."""
    return {d.lower().replace("_", "-"): m for m, ds in md.packages_distributions().items() for d in ds}


def _extra_modules(extras: set[str]) -> set[str]:

    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    unknown = extras - set(optional)
    assert not unknown, f"the image installs extras pyproject.toml does not declare: {unknown}"
    return {_module_of(r) for e in extras for r in optional[e]}


def _image_refs() -> list[tuple[str, str]]:
    """Every place an image of this project is named, with where: compose services, the CronJob,
    each workflow's ``# image:`` line, and ``docker build -t``/``docker run`` in the Dockerfiles'
    comments, README, docs and workflows."""

    refs = []
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    for name, service in compose["services"].items():
        if "build" in service:
            refs.append((f"compose.yaml: {name}", service["image"]))
    for doc in yaml.safe_load_all((SCHEDULE / "nightly-cronjob.yaml").read_text()):
        if doc["kind"] == "CronJob":
            for c in doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]:
                refs.append((f"nightly-cronjob.yaml: {c['name']}", c["image"]))
    texts = [*DOCKERFILES.values(), ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "workflows").rglob("*")]
    value_options = {"-v", "--volume", "-e", "--env", "--gpus", "--entrypoint", "-p", "--publish", "--name", "-w"}
    for path in texts:
        if not path.is_file():
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            where = f"{path.relative_to(ROOT)}, line {number}"
            if m := re.match(r"#\s*image:\s*(\S+)", line):
                refs.append((where, m.group(1)))
            for cmd in re.findall(r"docker (?:build|run) [^#`]*", line):
                words = shlex.split(cmd.replace('"$PWD', '"PWD'))
                if words[1] == "build" and "-t" in words:
                    assert words[-1] != "-t", f"{where}: docker build -t with no image name on its line"
                    refs.append((where, words[words.index("-t") + 1]))
                elif words[1] == "run":
                    rest = words[2:]
                    while rest and rest[0].startswith("-"):
                        rest = rest[2:] if rest[0] in value_options else rest[1:]
                    refs.append((where, rest[0]))
            for stale in re.findall(r"\b(tensorflow-ooc:\S+|tfooc(?:-gpu)?:latest)\b", line):
                refs.append((where, stale))
    return refs


def test_one_image_name_and_tag_everywhere():
    """The images are named tfooc:VERSION and tfooc-gpu:VERSION (the package version) in compose,
    the CronJob, the workflows and every docker command of the docs; each shipped workflow names
    its image."""
    version = _project_version()
    refs = _image_refs()
    wrong = [(where, image) for where, image in refs if image not in (f"tfooc:{version}", f"tfooc-gpu:{version}")]
    assert not wrong, wrong
    wheres = {where.split(",")[0] for where, _ in refs}
    assert {"nightly-cronjob.yaml: tfooc", "compose.yaml: scheduler", "docker/Dockerfile"} <= wheres, wheres
    for spec in (ROOT / "workflows").glob("*.yaml"):
        assert f"workflows/{spec.name}" in wheres, f"{spec.name} names no image (# image: ...)"


def _create_missing_inputs(path: Path, storage: Path):
    """Load a shipped spec under ``storage``, first making the inputs an operator provides (the
    nightly drop folders, a query file): load_spec names each one missing."""
    from tensorflow_ooc.workflow import SpecError, load_spec

    for _ in range(5):
        try:
            return load_spec(str(path), storage=str(storage))
        except SpecError as exc:
            missing = [p.message.split("missing input: ", 1)[1].split(" does not exist")[0] for p in exc.problems]
            assert missing and all(m.startswith(str(storage)) for m in missing), exc
            for m in map(Path, missing):
                if m.suffix:
                    m.parent.mkdir(parents=True, exist_ok=True)
                    m.touch()
                else:
                    m.mkdir(parents=True, exist_ok=True)
    raise AssertionError(f"{path}: still not loadable")


def test_images_install_what_the_shipped_workflows_import(tmp_path):
    """Each shipped workflow's optional imports (TensorLy for a tensorly export, dask-cuda for the
    gpu cluster, ...) are installed by the image it names; both images reach s3:// storage roots
    (the CronJob's notes name one), and a missing package is a bad-input error naming its extra."""

    from tensorflow_ooc.workflow.optional_packages import EXTRAS, install_hint, location_module, needed_modules

    version = _project_version()
    image_file = {f"tfooc:{version}": "Dockerfile", f"tfooc-gpu:{version}": "Dockerfile.gpu"}
    installed = {name: _extra_modules(_pip_extras(path)) for name, path in DOCKERFILES.items()}
    needs_seen: set[str] = set()
    for spec in sorted((ROOT / "workflows").glob("*.yaml")):
        image = re.search(r"^#\s*image:\s*(\S+)", spec.read_text(), re.M).group(1)
        workflow = _create_missing_inputs(spec, tmp_path / spec.stem)
        needed = needed_modules(workflow)
        needs_seen |= set(needed)
        missing = set(needed) - installed[image_file[image]]
        assert not missing, f"{spec.name} runs in {image}, which lacks {missing} ({needed})"
    assert {"tensorly", "dask_cuda", "numba_cuda"} <= needs_seen  # what the shipped workflows use
    # a storage root in S3 (the CronJob's notes offer one: TFOOC_STORAGE=s3://...) needs s3fs
    assert "s3://" in (SCHEDULE / "nightly-cronjob.yaml").read_text()
    assert location_module("s3://bucket/tfooc") == "s3fs" and location_module("/data") is None
    assert all("s3fs" in mods for mods in installed.values()), installed
    for module, extra in EXTRAS.items():
        assert module in _extra_modules({extra}), f"{module} is not in the extra {extra}"
    # a spec whose export's package is missing is refused naming the extra that installs it
    assert install_hint("tensorly") == "pip install 'tensorflow_ooc[exports]'"


def _ignore_rules() -> list[tuple[bool, re.Pattern[str]]]:
    """.dockerignore's patterns as Docker reads them: relative to the context's root, ``*`` and
    ``?`` within a name, ``**`` across folders, ``!`` an exception; the last that matches wins."""

    rules = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keep = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        rx = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                rx, i = rx + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                rx, i = rx + ".*", i + 2
            elif pattern[i] == "*":
                rx, i = rx + "[^/]*", i + 1
            elif pattern[i] == "?":
                rx, i = rx + "[^/]", i + 1
            else:
                rx, i = rx + re.escape(pattern[i]), i + 1
        rules.append((keep, re.compile(rx + "$")))
    return rules


def _ignored(rel: str, rules) -> bool:
    """Whether the build context leaves out ``rel`` (a path relative to the root): a pattern that
    matches a folder leaves out what is inside it."""
    parts = rel.split("/")
    out = False
    for keep, rx in rules:
        if any(rx.match("/".join(parts[:k])) for k in range(1, len(parts) + 1)):
            out = not keep
    return out


def _context_files(rules) -> list[Path]:
    """The files ``docker build`` sends from this repository (walking around ignored folders)."""

    out = []
    for folder, dirs, files in os.walk(ROOT):
        rel = Path(folder).relative_to(ROOT).as_posix()
        base = "" if rel == "." else rel + "/"
        # a folder left out may still hold an exception (storage/README.md): walk those
        dirs[:] = [d for d in dirs if not _ignored(base + d, rules) or base + d == "storage"]
        out += [Path(folder) / f for f in files if not _ignored(base + f, rules)]
    return out


def test_dockerignore_keeps_the_context_small():
    """The virtual environment, stores, run records, git history, caches and benchmark results stay
    out of the build context; everything the Dockerfiles COPY goes in."""
    rules = _ignore_rules()
    for big in (
        ".venv/lib/python3.11/site-packages/numpy/__init__.py",
        ".git/objects/pack/pack-1.pack",
        ".git",  # a worktree's .git is a file
        "storage/quickstart.zarr/zarr.json",
        "storage/.tfooc/runs/r-1/record.json",
        "benchmarks/results/cpals-2026.json",
        "tensorflow_ooc/kernels/__pycache__/cpu.item-572.py311.1.nbc",
        "tensorflow_ooc/__pycache__/cli.cpython-311.pyc",
        ".pytest_cache/v/cache/lastfailed",
        ".ruff_cache/0.6/x",
        "tensorflow_ooc.egg-info/PKG-INFO",
        "build/lib/tensorflow_ooc/__init__.py",
    ):
        assert _ignored(big, rules), f"{big} goes into the build context"
    # what the images copy (COPY SRC... DEST, from the context's root) is all there
    copied = {
        src for path in DOCKERFILES.values() for w, a in _instructions(path) if w == "COPY" for src in a.split()[:-1]
    }
    assert {"pyproject.toml", "README.md", "tensorflow_ooc", "workflows"} <= copied, copied
    for src in copied:
        # (caches and the benchmarks' results are not the images' to carry)
        files = [
            p
            for p in (ROOT / src).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and not p.relative_to(ROOT).match("benchmarks/results/*")
        ]
        files += [ROOT / src] if (ROOT / src).is_file() else []
        assert files, src
        sent = [p for p in files if not _ignored(p.relative_to(ROOT).as_posix(), rules)]
        assert sent == files, f"{src}: {sorted(set(files) - set(sent))[:5]} left out of the build context"
    assert not _ignored("storage/README.md", rules)
    # this checkout's context, as the Docker client would send it: the package, not the venv
    context = _context_files(rules)
    size = sum(p.stat().st_size for p in context)
    assert size < 50 * 2**20, f"{size / 2**20:.0f} MiB in the build context"
    assert not [p for p in context if ".venv" in p.parts or "results" in p.parts]


def test_systemd_unit_restarts_on_failure_and_keeps_the_numba_cache():
    """The service restarts after a failed night (exit 1) but not after a bad spec (exit 2), counts
    exit 3 (nothing new) as success, and keeps numba's cache in its CacheDirectory."""

    unit = configparser.ConfigParser(interpolation=None, strict=True, delimiters=("=",))
    unit.optionxform = str  # systemd's keys are case-sensitive
    unit.read_string((SCHEDULE / "tfooc-nightly.service").read_text())
    service = unit["Service"]
    assert service["Type"] == "oneshot" and service["Restart"] == "on-failure"
    assert "2" in service["RestartPreventExitStatus"].split() and "3" in service["SuccessExitStatus"].split()
    assert int(unit["Unit"]["StartLimitBurst"]) >= 2  # a restart is allowed within the limit
    env = dict(kv.split("=", 1) for kv in shlex.split(service["Environment"]))
    assert env["NUMBA_CACHE_DIR"].startswith("/var/cache/" + service["CacheDirectory"].split("/")[0])
    assert env["NUMBA_CACHE_DIR"] == "/var/cache/" + service["CacheDirectory"]
    assert "-q run workflows/nightly.yaml" in service["ExecStart"] and env["TFOOC_STORAGE"]
    timer = configparser.ConfigParser(interpolation=None, delimiters=("=",))
    timer.optionxform = str
    timer.read_string((SCHEDULE / "tfooc-nightly.timer").read_text())
    assert timer["Timer"]["Unit"] == "tfooc-nightly.service"
    if shutil.which("systemd-analyze"):  # where systemd is at hand, its own reading of the files
        check_unit_with_systemd(unit, timer)


def check_unit_with_systemd(unit, timer) -> None:
    """``systemd-analyze verify`` of the unit and the timer, with ExecStart and User replaced by
    what exists here: it must print nothing (it exits 0 even for a key it cannot parse)."""

    with tempfile.TemporaryDirectory() as tmp:
        unit["Service"]["ExecStart"] = "/bin/true"
        unit["Service"]["User"] = "root"
        for name, cfg in (("tfooc-nightly.service", unit), ("tfooc-nightly.timer", timer)):
            buf = io.StringIO()
            cfg.write(buf, space_around_delimiters=False)
            Path(tmp, name).write_text(buf.getvalue())
        out = subprocess.run(
            ["systemd-analyze", "verify", f"{tmp}/tfooc-nightly.service", f"{tmp}/tfooc-nightly.timer"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    complaints = [line for line in (out.stdout + out.stderr).splitlines() if "tfooc-nightly" in line]
    assert out.returncode == 0 and not complaints, out.stdout + out.stderr


def test_numba_cache_on_a_volume_in_compose_kubernetes_and_the_image():
    """NUMBA_CACHE_DIR is one folder, a volume there in compose (every tfooc service) and a claim
    there in the CronJob (declared beside it), and the image's default."""
    env = _env(_instructions(DOCKER / "Dockerfile"))
    assert env["NUMBA_CACHE_DIR"] == NUMBA_CACHE == _env(_instructions(DOCKER / "Dockerfile.gpu"))["NUMBA_CACHE_DIR"]

    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    for name, service in compose["services"].items():
        if "build" not in service:
            continue
        assert service["environment"]["NUMBA_CACHE_DIR"] == NUMBA_CACHE, name
        mounts = dict(v.rsplit(":", 1)[::-1] for v in service["volumes"])
        assert mounts[NUMBA_CACHE] in compose["volumes"], name  # a named volume, kept across containers

    docs = list(yaml.safe_load_all((SCHEDULE / "nightly-cronjob.yaml").read_text()))
    (job,) = [d for d in docs if d["kind"] == "CronJob"]
    claims = {d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"}
    pod = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    for c in pod["containers"]:
        assert {e["name"]: e["value"] for e in c["env"]}["NUMBA_CACHE_DIR"] == NUMBA_CACHE
        (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == NUMBA_CACHE]
        assert volumes[mount["name"]]["persistentVolumeClaim"]["claimName"] in claims


def _base_python() -> str:
    """The interpreter this test's venv was made from (a venv of it is a plain one)."""
    return getattr(sys, "_base_executable", None) or sys.executable


def test_image_entrypoint_runs_in_a_plain_venv(tmp_path):
    """The CPU image built without Docker: its Dockerfile's COPY, WORKDIR, ENV and RUN pip install
    done under a folder that stands for the container's root, into a fresh venv that sees the
    dependencies this environment has (the image's pip would download them) and nothing of this
    checkout. Its ENTRYPOINT then runs: the CMD's command parses, the shipped workflows that the
    image's command and the CronJob run validate where the image puts them, and a run generates a
    tensor and exports a tensor train to TensorLy, with numba's cache in the image's cache folder
    rather than beside the installed package."""

    import numpy as np

    from tensorflow_ooc.decompositions import TTResult

    chroot = tmp_path / "image"  # the container's /
    rules = _ignore_rules()

    def inside(path: str) -> Path:
        return chroot / path.lstrip("/")

    def not_sent(folder: str, names: list[str]) -> list[str]:
        return [n for n in names if _ignored((Path(folder) / n).relative_to(ROOT).as_posix(), rules)]

    venv = tmp_path / "venv"
    subprocess.run([_base_python(), "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (site_packages,) = venv.glob("lib/python3*/site-packages")
    deps = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (site_packages / "tfooc_test_dependencies.pth").write_text("\n".join(deps) + "\n")

    workdir, env, entrypoint, cmd = "/", {}, None, None
    for word, args in _instructions(DOCKER / "Dockerfile"):
        if word == "WORKDIR":
            workdir = os.path.join(workdir, args)
            inside(workdir).mkdir(parents=True, exist_ok=True)
        elif word == "COPY":
            *sources, dest = args.split()
            target = inside(os.path.join(workdir, dest))
            for src in sources:
                if (ROOT / src).is_dir():
                    shutil.copytree(ROOT / src, target, ignore=not_sent, dirs_exist_ok=True)
                else:  # COPY FILE... DIR/
                    target.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(ROOT / src, target / src)
        elif word == "RUN" and "pip install" in args:
            # the package as the image installs it (not editable); the extras' packages are among
            # the dependencies this environment has (test_images_install_... checks the extras)
            subprocess.run(
                [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps",
                 "--no-cache-dir", str(inside(workdir))],
                check=True, timeout=300, capture_output=True,
            )  # fmt: skip
        elif word == "RUN" and args.startswith("mkdir -p "):
            for folder in args.split("&&")[0].split()[2:]:
                inside(folder).mkdir(parents=True, exist_ok=True)
        elif word == "ENV":
            env.update(_env([(word, args)]))
        elif word == "ENTRYPOINT":
            entrypoint = _exec_form(args)
        elif word == "CMD":
            cmd = _exec_form(args)
    assert entrypoint == ["tfooc"] and cmd and workdir == "/data"

    container_env = {k: str(inside(v)) if v.startswith("/") else v for k, v in env.items()}
    run_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NUMBA_CACHE_DIR", "TFOOC_STORAGE")}
    run_env |= container_env | {"PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    data, workflows = Path(container_env["TFOOC_STORAGE"]), Path(container_env["TFOOC_WORKFLOWS"])
    numba_cache = Path(container_env["NUMBA_CACHE_DIR"])
    assert numba_cache.is_dir() and data.is_dir() and not list(numba_cache.iterdir())

    def entry(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        exe = shutil.which(entrypoint[0], path=str(venv / "bin"))
        assert exe and Path(exe).parent == venv / "bin", "the venv has no tfooc command"
        return subprocess.run(
            [exe, *entrypoint[1:], *args], cwd=inside(workdir), env=run_env, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip

    # the package is the installed copy, not this checkout's
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import tensorflow_ooc; print(tensorflow_ooc.__file__)"],
        cwd=inside(workdir), env=run_env, capture_output=True, text=True, timeout=120, check=True,
    ).stdout.strip()  # fmt: skip
    assert Path(where).is_relative_to(site_packages), where

    # the default command (tfooc quickstart --storage /data) parses; the specs it and the CronJob run
    # validate where the image has them
    done = entry(*[str(inside(a)) if a.startswith("/") else a for a in cmd], "--help")
    assert done.returncode == 0 and "quickstart" in done.stdout, done.stderr
    for name in ("quickstart.yaml", "nightly.yaml"):
        _create_missing_inputs(workflows / name, data)
        done = entry("validate", str(workflows / name), timeout=120)  # the storage root: $TFOOC_STORAGE
        assert done.returncode == 0 and f"storage root {data}" in done.stdout, (name, done.stdout, done.stderr)

    # a run: a generated tensor (numba kernels compiled, and cached) and a TensorLy export of a train
    rng = np.random.default_rng()
    shape, ranks = rng.integers(3, 9, 3).tolist(), [1, *rng.integers(1, 4, 2).tolist(), 1]
    cores = [rng.standard_normal((ranks[k], n, ranks[k + 1])) for k, n in enumerate(shape)]
    TTResult(cores=cores, fit=0.5, sweeps=1).save(str(data / "train.zarr"))
    spec = data / "image-check.yaml"
    spec.write_text(
        "name: image-check\nsteps:\n"
        f"  generate: {{kind: generate, out: t.tns, shape: {shape}, nnz: 60, model: planted, rank: 2, seed: 0}}\n"
        "  export: {kind: export, result: train.zarr, format: tensorly, out: train.pkl}\n"
    )
    done = entry("run", str(spec))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    with open(data / "train.pkl", "rb") as f:
        train = pickle.load(f)
    assert type(train).__module__.startswith("tensorly")
    for got, want in zip(train.factors, cores, strict=True):
        np.testing.assert_array_equal(got, want)
    assert (data / "t.tns").stat().st_size > 0
    # numba's cache went to the image's cache folder (a volume there keeps it), not into the package
    assert list(numba_cache.rglob("*.nbi")), "nothing in NUMBA_CACHE_DIR"
    assert not list((site_packages / "tensorflow_ooc").rglob("*.nbi"))
