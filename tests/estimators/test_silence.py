"""A fit prints nothing it should not (issue 24, item 3): the embedded
cluster serves its dashboard on a free port and a verbose fit says where,
no ``Port 8787 is already in use`` warning and no unclosed-socket
``ResourceWarning`` when another dashboard holds 8787, nothing at exit after
a fit with worker processes, and no feature-name warning when predicting on
the dask DataFrame a model was fitted on.

On 3860c22 each of these printed: the embedded cluster asked for :8787, a
worker process still finalizing 4 s after the nanny asked it to stop was
killed with a warning, and ``validate_data`` did not see a dask
DataFrame's columns.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

pytest.importorskip("numba")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def port_8787_taken():
    """Another 'dashboard' on 8787 (when this machine has none already)."""
    s = socket.socket()
    try:
        s.bind(("", 8787))
        s.listen(1)
    except OSError:
        pass  # already in use: the condition under test holds anyway
    yield
    s.close()


def _run(*parts: str, timeout=240, own_session=False) -> subprocess.CompletedProcess:
    """The script in a fresh process (``own_session``: in a process group
    of its own, which a script's Ctrl-C to its group reaches alone)."""
    # The child takes Ctrl-C as a terminal's program does, whatever its runner: a test run started in
    # the background (`pytest &` in a script) ignores SIGINT, its children inherit that, and the two
    # Ctrl-C tests then waited for an interrupt that never came (240 s each). A child that hangs all
    # the same prints where its threads are (stderr) and exits before the timeout kills it.
    script = ("import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
              f"import faulthandler; faulthandler.dump_traceback_later({max(1, timeout - 30)}, exit=True)\n"
              + "".join(textwrap.dedent(p) for p in parts))
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-W", "always::ResourceWarning", "-c", script],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO,
                          start_new_session=own_session)


# A fit that starts the embedded cluster: a small one with no cluster chosen
# trains in the calling process (ps.sgd.fit-in-process) and starts none.
FIT = """
    import dask
    import numpy as np
    from dask_ps.linear_model import SGDClassifier
    dask.config.set({{"ps.sgd.fit-in-process": False}})
    rng = np.random.RandomState(0)
    X = rng.randn(600, 5)
    y = (X[:, 0] > 0).astype(int)
    SGDClassifier(max_iter=3, tol=None, verbose={verbose}).fit(X, y)
"""


def test_embedded_cluster_dashboard_on_a_free_port_said_in_verbose_output(port_8787_taken):
    """The line goes to standard error: standard output holds the
    estimator's lines alone, as many as scikit-learn's (its LDA
    test_verbosity counts them, also on a process's first fit)."""
    out = _run(FIT.format(verbose=1))
    assert out.returncode == 0, out.stderr
    # that line alone: no port warning, no ResourceWarning, nothing at exit
    # (but a compile notice, where this process compiled a kernel for long)
    [line] = [s for s in out.stderr.splitlines() if not s.startswith("dask_ps: compil")]
    assert line.startswith("dask_ps: started a local Dask cluster (") and "dashboard at http://" in line
    assert ":8787/" not in line
    assert out.stdout.splitlines()[0].startswith("-- Epoch 1")  # scikit-learn's lines


def test_embedded_cluster_without_dashboard(port_8787_taken):
    out = _run("""
        import dask
        dask.config.set({"ps.embedded-cluster.dashboard-address": None})
    """, FIT.format(verbose=1))
    assert out.returncode == 0, out.stderr
    [line] = [s for s in out.stderr.splitlines() if not s.startswith("dask_ps: compil")]
    assert "no dashboard" in line


def test_not_verbose_says_nothing(port_8787_taken):
    out = _run(FIT.format(verbose=0))
    assert out.returncode == 0, out.stderr
    assert (out.stdout, out.stderr) == ("", "")


def test_nothing_at_exit_after_a_fit_with_worker_processes(port_8787_taken):
    """Worker processes that take 6 s to exit (an atexit handler sleeps, as
    a busy machine's finalization of the loaded libraries did): the
    embedded cluster's nanny waits for them instead of killing them with a
    warning."""
    out = _run("""
        import dask
        dask.config.set({"ps.embedded-cluster.processes": True, "ps.embedded-cluster.n-workers": 2})
    """, FIT.format(verbose=0), """
    import dask_ps._client as c

    def slow_exit():
        import atexit, time
        atexit.register(time.sleep, 6)

    c._auto_ps.client.run(slow_exit)
    """)
    assert out.returncode == 0, out.stderr
    assert "still alive" not in out.stderr
    # The plugin's pause guard may warn when a worker's event loop stalled
    # (imports of the kernels' libraries hold the GIL in a fresh worker
    # process): not an exit message, reported apart (issue 24 notes).
    others = [line for line in out.stderr.splitlines() if "this worker did not run for" not in line]
    assert others == []


def test_no_feature_name_warning_on_the_frame_the_model_was_fitted_on(client):
    dd = pytest.importorskip("dask.dataframe")
    pd = pytest.importorskip("pandas")
    from dask_ps.linear_model import SGDClassifier, SGDRegressor

    rng = np.random.RandomState(0)
    X = pd.DataFrame(rng.randn(200, 3), columns=["a", "b", "c"])
    dX = dd.from_pandas(X, npartitions=2)
    dy = dd.from_pandas(pd.Series((X.a > 0).astype(int)), npartitions=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        clf = SGDClassifier(max_iter=20, tol=None, client=client).fit(dX, dy)
        clf.predict(dX).compute()
        clf.decision_function(dX).compute()
        clf.partial_fit(dX, dy)
        reg = SGDRegressor(max_iter=20, tol=None, client=client).fit(dX, dy.astype(float))
        reg.predict(dX).compute()
        reg.predict(X)  # pandas too
    assert list(clf.feature_names_in_) == ["a", "b", "c"]
    # scikit-learn's other messages about names stay
    with pytest.raises(ValueError, match="The feature names should match"):
        clf.predict(dX.rename(columns={"a": "z"}))
    with pytest.warns(UserWarning, match="X does not have valid feature names"):
        clf.predict(dX.to_dask_array(lengths=True))


def test_worker_processes_of_a_users_cluster_exit_with_their_objects_frozen(tmp_path):
    """A user's ``LocalCluster`` of worker processes (not the embedded one,
    whose nanny waits): each closing worker process freezes its objects
    before it exits, so the interpreter's shutdown does not walk every
    object of scikit-learn, scipy and numba (1.0-1.9 s at load 14-16; Dask's
    nanny kills a process still running after 4 s, with a warning per
    worker). Asserted on what the process did, not on how long it took:
    the garbage collector's frozen count at exit. On the previous commit it
    was 0."""
    from distributed import Client, LocalCluster

    from dask_ps.linear_model import SGDClassifier

    def note_frozen_at_exit(path):
        import atexit
        import gc
        import os

        atexit.register(lambda: open(os.path.join(path, f"{os.getpid()}.txt"), "w").write(str(gc.get_freeze_count())))

    rng = np.random.RandomState(0)
    X = rng.randn(600, 5)
    y = (X[:, 0] > 0).astype(int)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with Client(cluster, set_as_default=False) as client:
            SGDClassifier(max_iter=2, tol=None, random_state=0, client=client).fit(X, y)
            pids = set(client.run(os.getpid).values())
            client.run(note_frozen_at_exit, str(tmp_path))
    frozen = {int(p.stem): int(p.read_text()) for p in tmp_path.glob("*.txt")}
    assert set(frozen) == pids
    assert all(n > 0 for n in frozen.values()), frozen


def test_freeze_before_exit_only_in_a_closing_nanny_worker():
    """Never in the caller's own process (an in-process worker has no
    nanny) nor in a running worker (a plugin unregistered)."""
    import gc
    from types import SimpleNamespace

    from distributed.core import Status

    from dask_ps._host_memory import freeze_before_exit

    before = gc.get_freeze_count()
    assert not freeze_before_exit(SimpleNamespace(status=Status.closing, nanny=None))
    assert not freeze_before_exit(SimpleNamespace(status=Status.running, nanny="tcp://127.0.0.1:1"))
    # this test process has no multiprocessing parent: not a nanny's worker either
    assert not freeze_before_exit(SimpleNamespace(status=Status.closing, nanny="tcp://127.0.0.1:1"))
    assert gc.get_freeze_count() == before


def test_ctrl_c_during_a_run_prints_nothing():
    """Ctrl-C while the caller waits for a run's participants: the caller
    gets its KeyboardInterrupt and nothing else is printed. Before, each
    participant ended with RunAbortedError, logged by Dask ("Compute
    Failed"), and the interrupted gather left one "Task exception was never
    retrieved ... AllExit" traceback per participant (issue 35)."""
    out = _run("""
        import gc, os, signal, threading, time
        import numpy as np
        from distributed import Client, LocalCluster
        import dask_ps

        def forever(ctx, _):
            while True:
                ctx.push("t", np.ones(4))
                ctx.clock()

        with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None,
                          scheduler_kwargs={"dashboard": False, "dashboard_address": ":0"}) as cluster, \\
                Client(cluster) as client:
            ps = dask_ps.ParameterServer(client)
            ps.create_table("t", shape=(4,))

            def interrupt_once_running():
                while ps.pull("t").sum() < 8:  # both participants have pushed
                    time.sleep(0.01)
                os.kill(os.getpid(), signal.SIGINT)

            threading.Thread(target=interrupt_once_running, daemon=True).start()
            try:
                ps.run(forever, [0, 1])
            except KeyboardInterrupt:
                print("interrupted")
            deadline = time.monotonic() + 60
            while any(client.processing().values()) and time.monotonic() < deadline:
                time.sleep(0.05)  # the participants end at their next clock
            assert not any(client.processing().values())
            gc.collect()
            ps.close()
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "interrupted"
    assert _without_dask_close_chatter(out.stderr) == ""


def _without_dask_close_chatter(stderr: str) -> str:
    """``stderr`` less distributed's own INFO record of a worker's batched
    stream closed while the in-process cluster closes (with its
    CommClosedError traceback, at INFO): it came in about 1 of 3 runs of the
    Ctrl-C test, on the branch that made it and after the merge alike, and is
    Dask's shutdown, not a participant's error."""
    return re.sub(r"^.*distributed\.batched - INFO - Batched Comm Closed.*\n"
                  r"(?:Traceback \(most recent call last\):\n(?:[ \t].*\n)*[\w.]*CommClosedError.*\n)?",
                  "", stderr, flags=re.M)


def test_ctrl_c_in_a_terminal_leaves_the_embedded_worker_processes_running():
    """Ctrl-C in a terminal reaches the whole process group: the embedded
    cluster's worker processes too. They ignore it (the program gets its
    KeyboardInterrupt), so the next run has its workers and nothing is
    printed. Before, each died with a KeyboardInterrupt traceback, the
    interrupted gather printed "Task exception was never retrieved ...
    AllExit" per participant, and the next fit waited 30 s for workers and
    raised NoWorkersError (issue 35)."""
    out = _run("""
        import gc, os, signal, threading, time
        import dask
        import numpy as np
        dask.config.set({"ps.embedded-cluster.processes": True, "ps.embedded-cluster.n-workers": 2})
        from dask_ps._client import get_parameter_server

        def forever(ctx, _):
            while True:
                ctx.push("t", np.ones(4))
                ctx.clock()

        ps = get_parameter_server()
        ps.create_table("t", shape=(4,))

        def ctrl_c_once_running():
            while ps.pull("t").sum() < 8:  # both participants have pushed
                time.sleep(0.01)
            os.killpg(os.getpgid(0), signal.SIGINT)  # what a terminal's Ctrl-C does

        threading.Thread(target=ctrl_c_once_running, daemon=True).start()
        try:
            ps.run(forever, [0, 1])
        except KeyboardInterrupt:
            print("interrupted")
        print(ps.run(lambda ctx, _: ctx.rank, [0, 1]))  # the same workers
        gc.collect()
    """, own_session=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["interrupted", "[0, 1]"]
    assert out.stderr == ""
