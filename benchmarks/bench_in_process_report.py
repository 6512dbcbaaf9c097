"""CPU a small fit trained in the calling process spends showing itself on
the ``/ps`` page (issue 24): ``partial_fit`` of 30 samples (one of
``check_estimator``'s sizes) on an in-process cluster with the dashboard,
with the report (``_estimators.dashboard_run``) and without it, interleaved,
5 rounds of 200 fits each; CPU seconds of the whole process (the
in-process scheduler handles the events in it too). The difference is
within the noise of such a loop, so the report's own cost is also measured
alone: 2,000 reports of a fit (``dashboard_run`` and ``LocalRun.end``),
CPU of the whole process until the scheduler handled them.

    python benchmarks/bench_in_process_report.py
"""

from __future__ import annotations

import resource
import time
import warnings

from distributed import Client, LocalCluster
from sklearn.datasets import make_classification

import dask_ps
from dask_ps._dashboard import _Outbox
from dask_ps.linear_model import SGDClassifier, _training


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main(rounds=5, fits=200):
    warnings.filterwarnings("ignore")
    X, y = make_classification(30, 5, random_state=0)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address="127.0.0.1:0") as cl, \
            Client(cl, set_as_default=False) as client:
        dask_ps.ParameterServer(client)
        reporting = _training.dashboard_run

        def per_fit(report: bool, n: int) -> float:
            _training.dashboard_run = reporting if report else (lambda *a: None)
            t = _cpu()
            for i in range(n):
                SGDClassifier(random_state=i, client=client, max_iter=5).partial_fit(X, y, classes=[0, 1])
            time.sleep(0.5)  # the outbox sent, the events handled
            return (_cpu() - t) / n

        est = SGDClassifier(client=client, max_iter=5)
        t, n = _cpu(), 2000
        for _ in range(n):
            reporting(est, 5, "_sgd_participant").end()
        while _Outbox.of(client, 0.25).pending:  # until the last messages are sent
            time.sleep(0.05)
        time.sleep(0.1)  # and handled
        alone = (_cpu() - t) / n
        try:
            per_fit(True, 20), per_fit(False, 20)  # warm-up: kernels loaded
            out = {True: [], False: []}
            for _ in range(rounds):
                for report in (True, False):
                    out[report].append(per_fit(report, fits))
        finally:
            _training.dashboard_run = reporting
    print(f"the report alone: {1e6 * alone:.1f} us CPU a fit")
    for report, v in out.items():
        print(f"{'with the report' if report else 'without'}: median {1e3 * sorted(v)[len(v) // 2]:.3f} ms CPU a fit "
              f"({' '.join(f'{1e3 * x:.3f}' for x in v)})")


if __name__ == "__main__":
    main()
