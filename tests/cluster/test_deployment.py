"""The command-line recipe of ``docs/deployment.rst`` (issue 35, item 4), run
as written: ``dask scheduler --preload dask_ps`` and two ``dask worker``
processes on localhost, a client that fits an estimator through dask_ps,
then a clean shutdown; over TCP and over TLS with certificate files. The
processes' logs are checked too: no tracebacks and no nanny killing a worker
that did not exit (issue 35, item 5)."""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import socket
import subprocess
import sys

import dask
import numpy as np
import pytest
from distributed import Client

ROOT = pathlib.Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dask_cli(*args, log):
    """``dask <args>`` (the same interpreter), its output to ``log``; this
    checkout's dask_ps first on the path, as an installed copy would be."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, "-m", "dask", *args], stdout=log, stderr=subprocess.STDOUT, env=env)


@contextlib.contextmanager
def cli_cluster(tmp_path, tls_args=(), protocol="tcp"):
    """A scheduler with ``--preload dask_ps`` and two ``dask worker``
    processes (one worker each); yields (address, logs). On the way out the
    workers, then the scheduler, get SIGINT (Ctrl-C) and must exit 0."""
    port = free_port()
    address = f"{protocol}://127.0.0.1:{port}"
    logs = [tmp_path / name for name in ("scheduler.log", "worker-0.log", "worker-1.log")]
    files = [open(p, "w") for p in logs]
    procs = []
    try:
        procs.append(dask_cli("scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard",
                              "--preload", "dask_ps", *tls_args, log=files[0]))
        for f in files[1:]:
            procs.append(dask_cli("worker", address, "--nthreads", "1", "--no-dashboard", "--death-timeout", "60",
                                  *tls_args, log=f))
        yield address, logs
        for p in procs[1:] + procs[:1]:  # workers first: the scheduler's close would close them
            p.send_signal(signal.SIGINT)
            p.wait(timeout=60)
        codes = [p.returncode for p in procs]
        assert codes == [0, 0, 0], (codes, [p.read_text() for p in logs])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in files:
            f.close()


def fit_and_check(client):
    from dask_ps.linear_model import SGDClassifier

    client.wait_for_workers(2, timeout=60)
    rng = np.random.RandomState(0)
    X = rng.randn(2000, 5)
    y = (X @ np.arange(1.0, 6.0) > 0).astype(int)
    with dask.config.set({"ps.sgd.min-samples-per-participant": 500}):  # small data, still 2 participants
        est = SGDClassifier(max_iter=5, tol=None, random_state=0, client=client).fit(X, y)
    assert len(est.metrics_) == 2  # one participant on each worker process
    assert est.score(X, y) > 0.9


def assert_quiet(logs):
    for path in logs:
        text = path.read_text()
        for noise in ("Traceback", "Task exception was never retrieved", "still alive after",
                      "Failed to start preload", "ERROR"):
            assert noise not in text, f"{path.name}:\n{text}"


@pytest.mark.slow
def test_cli_scheduler_and_workers(tmp_path):
    with cli_cluster(tmp_path) as (address, logs):
        with Client(address, timeout=60, set_as_default=False) as client:
            fit_and_check(client)
            # the preload ran in the scheduler process
            assert client.run_on_scheduler(lambda: "dask_ps" in sys.modules)
    assert_quiet(logs)


@pytest.mark.slow
def test_cli_scheduler_and_workers_over_tls(tmp_path):
    pytest.importorskip("cryptography")
    from distributed.security import Security

    temp = Security.temporary()  # PEM text: written to files, as a user's certificates are
    ca, cert, key = tmp_path / "ca.pem", tmp_path / "cert.pem", tmp_path / "key.pem"
    ca.write_text(temp.tls_ca_file)
    cert.write_text(temp.tls_scheduler_cert)
    key.write_text(temp.tls_scheduler_key)
    tls = ("--tls-ca-file", str(ca), "--tls-cert", str(cert), "--tls-key", str(key))
    sec = Security(tls_ca_file=str(ca), tls_client_cert=str(cert), tls_client_key=str(key),
                   require_encryption=True)
    with cli_cluster(tmp_path, tls, protocol="tls") as (address, logs):
        with Client(address, security=sec, timeout=60, set_as_default=False) as client:
            fit_and_check(client)
            assert all(w.startswith("tls://") for w in client.scheduler_info()["workers"])
    assert_quiet(logs)


@pytest.mark.slow
def test_wheel_installs_and_imports(tmp_path):
    """``pip wheel --no-deps -w dist .`` (docs/deployment.rst) gives a wheel
    that holds the package and its settings, and a fresh environment that
    installs it imports it from there, settings included (the dependencies
    come from this environment: --system-site-packages)."""
    import shutil
    import venv
    import zipfile

    src, dist = tmp_path / "src", tmp_path / "dist"  # a copy: the build leaves build/ and *.egg-info behind
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", "__pycache__", "build", "*.egg-info", "_build"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)],
                   check=True, cwd=tmp_path, timeout=300)
    [wheel] = dist.glob("dask_ps-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "dask_ps/ps.yaml" in names and "dask_ps/linear_model/__init__.py" in names
    env_dir = tmp_path / "env"
    venv.create(env_dir, system_site_packages=True, with_pip=False)
    python = env_dir / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--force-reinstall", "-q", str(wheel)],
                   check=True, cwd=tmp_path, timeout=300)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([str(python), "-c", "import dask, dask_ps; print(dask_ps.__file__); "
                          "print(dask.config.get('ps.block-bytes'))"],
                         capture_output=True, text=True, check=True, cwd=tmp_path, env=env, timeout=120)
    where, block_bytes = out.stdout.split()
    assert where.startswith(str(env_dir)), where
    assert block_bytes
