"""BSP fits in both layouts: the same ``random_state`` gives the same
``coef_``/``intercept_`` bytes on 2 threads workers and on 2 worker
processes, for the cases issue 33's third pass changed: sparse averaged
fits (the averages held as offsets, ``_averages``; ``average=True`` and
10, regressor and classifier) and a one-block dask input stored grouped
(assembled in a seeded shuffle, ``_exchange.order_z``)::

    PYTHONPATH=$PWD python benchmarks/sgd_layouts_same_bits.py
"""

from __future__ import annotations

import hashlib
import pathlib
import sys
import warnings

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import sgd_data  # noqa: E402
import sgd_issue_cases  # noqa: E402
import sgd_sorted_dask  # noqa: E402


def _hash(est):
    return hashlib.sha256(est.coef_.tobytes() + np.asarray(est.intercept_).tobytes()).hexdigest()[:12]


def fits(client):
    """The hashes of the cases' fits on ``client``'s cluster (2 workers)."""
    import dask_ps.linear_model as dpl

    Xr, yr, _, _ = sgd_data.make("tfidf", False, 4000)
    Xc, yc, _, _ = sgd_data.make("text", True, 4000)
    Xs, ys, _, _ = sgd_issue_cases._data("sorted")
    o = sgd_sorted_dask.halves(len(ys))
    kw = dict(tol=None, random_state=0, client=client)
    out = []
    for avg in (True, 10):
        out.append(_hash(dpl.SGDRegressor(average=avg, learning_rate="constant", eta0=0.05, max_iter=3, **kw)
                         .fit(Xr, yr)))
        out.append(_hash(dpl.SGDClassifier(average=avg, max_iter=3, **kw).fit(Xc, yc)))
    dX, dy = sgd_sorted_dask.dask_blocks(client, Xs[o], ys[o], 2, sgd_sorted_dask.PLACEMENTS["interleaved"])
    out.append(_hash(dpl.SGDClassifier(max_iter=2, **kw).fit(dX, dy)))
    out.append(_hash(dpl.SGDClassifier(average=True, max_iter=2, **kw).fit(dX, dy)))
    return out


def main():
    import dask
    from distributed import Client, LocalCluster

    # Imported before the dask.config.set block: leaving that block would
    # drop the ps.* defaults an import inside it registered.
    import dask_ps.linear_model  # noqa: F401

    warnings.simplefilter("ignore")
    got = {}
    for layout in ("threads", "processes"):
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=layout == "processes", memory_limit=0,
                          dashboard_address=None) as cluster, Client(cluster, set_as_default=False) as client, \
                dask.config.set({"ps.sgd.min-samples-per-participant": 1000}):
            got[layout] = fits(client)
        print(layout, got[layout], flush=True)
    print(f"threads = processes: {got['threads'] == got['processes']} ({len(got['threads'])} fits)")


if __name__ == "__main__":
    main()
