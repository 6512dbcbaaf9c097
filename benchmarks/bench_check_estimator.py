"""scikit-learn's ``check_estimator`` on dask_ps's three estimators against
scikit-learn's estimators of the same names (issue 24: within 3x).

Each estimator is measured in a fresh Python process of its own (nothing
imported or compiled before), at its defaults (``client=None``), with the
installed scikit-learn's ``check_estimator(on_fail=None)``:

- cold: the process's first ``check_estimator`` of each, scikit-learn's
  first, then dask_ps's (which starts the embedded cluster if a check needs
  it and loads, or with ``--empty-cache`` compiles, its numba kernels);
- warm: then ``--repeat`` more of each, alternating, in the same process;
  the ratio of each pair is reported (range and median);
- CPU: the same pairs in CPU seconds of the process (``time.process_time``:
  all its threads, the embedded cluster's too, which are threads), a
  measure the other programs of a shared machine disturb less.

The seconds do not include importing either package. ``--empty-cache``
gives the cold process an empty kernel cache (``DASK_PS__KERNEL_CACHE_DIR``),
what a fresh install does; otherwise the user's cache is used as it is.
The names of the checks that fail are printed for both (they should be the
same: ``tests/estimators/test_check_estimator_defaults.py``).

    python benchmarks/bench_check_estimator.py
    python benchmarks/bench_check_estimator.py --repeat 3 --empty-cache
    python benchmarks/bench_check_estimator.py --only LatentDirichletAllocation
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ESTIMATORS = ("SGDClassifier", "SGDRegressor", "LatentDirichletAllocation")

CHILD = r"""
import json, sys, time, warnings
name, repeat = sys.argv[1], int(sys.argv[2])
from sklearn.utils.estimator_checks import check_estimator
if name == "LatentDirichletAllocation":
    from sklearn.decomposition import LatentDirichletAllocation as Theirs
    from dask_ps.decomposition import LatentDirichletAllocation as Ours
else:
    import sklearn.linear_model, dask_ps.linear_model
    Theirs, Ours = getattr(sklearn.linear_model, name), getattr(dask_ps.linear_model, name)

CPU = {"sklearn": [], "dask_ps": []}

def timed(cls, who):
    t, c = time.perf_counter(), time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = check_estimator(cls(), on_fail=None, on_skip=None)
    CPU[who].append(time.process_time() - c)
    return time.perf_counter() - t, sorted({r["check_name"] for r in results if r["status"] == "failed"}), len(results)

out = {"warm": []}
sk, sk_failed, n = timed(Theirs, "sklearn")
ours, ours_failed, n_ours = timed(Ours, "dask_ps")
out["cold"] = {"sklearn": sk, "dask_ps": ours}
out["checks"] = {"sklearn": n, "dask_ps": n_ours}
out["failed"] = {"sklearn": sk_failed, "dask_ps": ours_failed}
for _ in range(repeat):
    sk = timed(Theirs, "sklearn")[0]
    ours = timed(Ours, "dask_ps")[0]
    out["warm"].append({"sklearn": sk, "dask_ps": ours})
out["cpu"] = CPU
print("RESULT " + json.dumps(out))
"""


def run_child(name: str, repeat: int, cache_dir: str | None) -> dict:
    env = dict(os.environ)
    if cache_dir is not None:
        env.pop("NUMBA_CACHE_DIR", None)
        env["DASK_PS__KERNEL_CACHE_DIR"] = cache_dir
    proc = subprocess.run([sys.executable, "-c", CHILD, name, str(repeat)], env=env, capture_output=True,
                          text=True, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{name}: the child process failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="warm check_estimator pairs per estimator")
    parser.add_argument("--empty-cache", action="store_true", help="cold process on an empty kernel cache")
    parser.add_argument("--only", choices=ESTIMATORS, action="append", help="this estimator only (repeatable)")
    args = parser.parse_args(argv)
    with open("/proc/loadavg") if os.path.exists("/proc/loadavg") else open(os.devnull) as f:
        load = f.read().split()[:3]
    print(f"load average (1, 5, 15 min): {' '.join(load) or 'n/a'}; {os.cpu_count()} cores")
    print(f"{'estimator':28s} {'cold sk':>8s} {'cold ours':>9s} {'ratio':>6s}   {'warm sk':>8s} {'warm ours':>9s} "
          f"{'ratio (min-max)':>16s}   {'CPU cold':>8s} {'CPU warm (min-max)':>18s}")
    results = {}
    for name in args.only or ESTIMATORS:
        with tempfile.TemporaryDirectory() as empty:
            r = run_child(name, args.repeat, empty if args.empty_cache else None)
        results[name] = r
        cold = r["cold"]
        ratios = [w["dask_ps"] / w["sklearn"] for w in r["warm"]]
        sk_warm = statistics.median(w["sklearn"] for w in r["warm"]) if r["warm"] else float("nan")
        ours_warm = statistics.median(w["dask_ps"] for w in r["warm"]) if r["warm"] else float("nan")
        span = f"{statistics.median(ratios):.1f} ({min(ratios):.1f}-{max(ratios):.1f})" if ratios else "n/a"
        cpu = [o / max(k, 1e-9) for k, o in zip(r["cpu"]["sklearn"], r["cpu"]["dask_ps"])]
        cpu_span = f"{statistics.median(cpu[1:]):.1f} ({min(cpu[1:]):.1f}-{max(cpu[1:]):.1f})" if cpu[1:] else "n/a"
        print(f"{name:28s} {cold['sklearn']:8.2f} {cold['dask_ps']:9.2f} {cold['dask_ps'] / cold['sklearn']:6.1f}   "
              f"{sk_warm:8.2f} {ours_warm:9.2f} {span:>16s}   {cpu[0]:8.1f} {cpu_span:>18s}")
        if r["failed"]["sklearn"] != r["failed"]["dask_ps"]:
            print(f"  failed checks differ: scikit-learn {r['failed']['sklearn']}, dask_ps {r['failed']['dask_ps']}")
    return results


if __name__ == "__main__":
    main()
