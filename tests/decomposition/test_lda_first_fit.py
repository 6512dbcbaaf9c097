"""What a fresh install's first LDA fit compiles (issue 35): the kernels it
runs and nothing else, and none of numba's own array constructors; its
``bound_`` (scikit-learn's E-step and bound) only when it is read."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import dask
import numpy as np
import pytest
from scipy.special import gammaln

from dask_ps.decomposition import LatentDirichletAllocation, _lda_kernels

_FIRST_FIT = r"""
import json
import dask
import numpy as np
import numba.core.event as ev
compiled = []
class Count(ev.Listener):
    def on_start(self, event):
        fn = event.data["dispatcher"].py_func
        compiled.append(fn.__module__ + "." + fn.__qualname__)
    def on_end(self, event):
        pass
ev.register("numba:compile", Count())
from dask_ps.decomposition import LatentDirichletAllocation
X = np.random.RandomState(0).poisson(0.05, size=(120, 400))
est = LatentDirichletAllocation(n_components=5, max_iter=3, random_state=0).fit(X)
fit = list(compiled)
bound = est.bound_  # read: computed now
with dask.config.set({"ps.lda.deferred-bound-tokens": 0}):  # computed at the end of the fit
    eager = LatentDirichletAllocation(n_components=5, max_iter=3, random_state=0).fit(X).bound_
print("RESULT " + json.dumps({"fit": fit, "compiled": compiled, "bound": bound, "eager": eager}))
"""

# What a default fit runs: the dense sweep (it calls no other kernel; a small
# fit's starting counts are numpy's) ...
_FIT = {"_lda_kernels._dense_sweep"}
# ... and what reading its bound_ adds: scikit-learn's E-step and bound under
# the final counts.
_BOUND = {"_bound._psi", "_bound._count_terms", "_bound.doc_bounds"}


def test_a_first_fit_compiles_the_kernels_it_runs_only(tmp_path):
    """Each compiled entry point, and each of numba's array constructors a
    kernel calls (``np.empty``, ``np.zeros``: compiled on their first use in
    a process), cost a first fit 0.06-0.15 s of compile: a default fit
    compiles the one kernel it runs, and its kernels allocate nothing (their
    work arrays come from the Python callers). ``bound_`` of a small corpus
    is computed at its first read (its kernels were 1.1-1.2 s of CPU, more
    than the sampler's), to the bit what the end of the fit computes."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["DASK_PS__KERNEL_CACHE_DIR"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", _FIRST_FIT], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")][-1][len("RESULT "):])

    def ours(names):
        return sorted(name.removeprefix("dask_ps.decomposition.") for name in names if name.startswith("dask_ps."))

    assert ours(result["fit"]) == sorted(_FIT), result["fit"]
    assert ours(result["compiled"]) == sorted(_FIT | _BOUND), result["compiled"]
    assert not [name for name in result["compiled"] if name.startswith("numba.np.arrayobj")], result["compiled"]
    assert np.isfinite(result["bound"]) and result["bound"] == result["eager"]


def _small_corpus():
    return np.random.RandomState(3).poisson(0.1, size=(60, 120))


def test_a_deferred_bound_is_the_fits_bound_and_survives_pickling(client):
    """A small in-memory fit leaves ``bound_`` pending (not an instance
    attribute until read; the counts held until then); read, directly or
    after a pickle round trip, it is the bound the fit computes when told
    to (``ps.lda.deferred-bound-tokens: 0``), bit for bit, and the held data
    is dropped. ``verbose`` prints it, so computes it at the end of the fit
    (without it, an iteration that is a multiple of ``evaluate_every``
    prints nothing and leaves it pending); a fit without one, and a refit,
    replace the earlier one."""
    X = _small_corpus()

    def fit(**kw):
        kw = {"max_iter": 3, **kw}
        return LatentDirichletAllocation(n_components=4, random_state=0, client=client, **kw).fit(X)

    with dask.config.set({"ps.lda.deferred-bound-tokens": 0}):
        eager = fit()
    assert "bound_" in vars(eager) and "_bound_pending" not in vars(eager)
    assert not hasattr(LatentDirichletAllocation(), "bound_")
    lazy = fit()
    assert "bound_" not in vars(lazy) and "_bound_pending" in vars(lazy)
    held = lazy._bound_pending  # at most a count per token, not a second V x K table
    assert held.values.size <= lazy.n_tokens_ and held.matrix.nnz <= lazy.n_tokens_
    copy = pickle.loads(pickle.dumps(lazy))
    assert lazy.bound_ == eager.bound_ and copy.bound_ == eager.bound_
    assert "_bound_pending" not in vars(lazy) and vars(lazy)["bound_"] == eager.bound_
    assert "bound_" in vars(fit(verbose=1))
    assert "_bound_pending" in vars(fit(max_iter=4, evaluate_every=2))  # evaluations print nothing without verbose
    lazy.partial_fit(X[:10])  # a new call: its own bound_, pending again
    assert "bound_" not in vars(lazy) and np.isfinite(lazy.bound_) and lazy.bound_ != eager.bound_
    with dask.config.set({"ps.lda.deferred-bound-tokens": 100}):  # more tokens than that: at the end of the fit
        assert "bound_" in vars(fit())


def test_a_fit_of_several_participants_leaves_its_bound_to_its_first_read(client):
    """Two participants (their documents scored on the workers at the end
    of the fit before: 17-43% of a 10-50-iteration fit's wall) leave
    ``bound_`` pending too: read, it is the bound computed at the end of the
    fit up to the order of the sums; a pickle of the model holds the
    number, not the training counts."""
    X = np.random.RandomState(4).poisson(0.4, size=(400, 300))

    def fit():
        return LatentDirichletAllocation(n_components=5, max_iter=3, random_state=0, client=client,
                                         n_partitions=2).fit(X)

    with dask.config.set({"ps.lda.deferred-bound-tokens": 0}):
        eager = fit()
    lazy = fit()
    assert len(lazy.metrics_) == 2 and len(eager.metrics_) == 2
    assert "bound_" in vars(eager) and "_bound_pending" in vars(lazy)
    payload = pickle.dumps(lazy)
    assert len(payload) < len(pickle.dumps(eager)) + 1000  # no counts in it
    copy = pickle.loads(payload)
    assert copy.bound_ == pytest.approx(eager.bound_, rel=1e-9) and lazy.bound_ == copy.bound_
    assert "_bound_pending" not in vars(lazy) and "_bound_pending" not in vars(copy)


def test_a_corpus_of_little_work_is_sampled_by_one_participant(client):
    """``ps.lda.min-tokens-per-participant`` (200,000): at K=50 one
    participant sampled 72k-215k tokens 1.6-2.3x faster than two (the
    threshold was 20,000); a corpus past twice that gets two, and the
    setting still lowers it."""
    X = np.random.RandomState(5).poisson(0.5, size=(600, 400))  # ~120k tokens
    assert 100_000 < X.sum() < 400_000

    def participants(**kw):
        return len(LatentDirichletAllocation(n_components=5, max_iter=2, random_state=0, client=client,
                                             **kw).fit(X).metrics_)

    assert participants() == 1 and participants(n_jobs=2) == 1
    with dask.config.set({"ps.lda.min-tokens-per-participant": 20_000}):
        assert participants(n_jobs=2) == 2
    assert participants(n_partitions=2) == 2


def test_more_topics_need_more_tokens_a_participant():
    """Past K = 50 the threshold grows as sqrt(K / 50): two participants
    broke even at ~420k tokens at K=50 and ~1.8M at K=1000."""
    from dask_ps.decomposition._lda import min_tokens_per_participant

    assert min_tokens_per_participant(10) == min_tokens_per_participant(50) == 200_000
    assert min_tokens_per_participant(1000) == int(200_000 * 20 ** 0.5)  # 894,427: two from 1.79M tokens
    with dask.config.set({"ps.lda.min-tokens-per-participant": 10}):
        assert min_tokens_per_participant(200) == 20


@pytest.mark.parametrize("shape", [(300, 10), (40, 1), (0, 4), (6, 0)])
@pytest.mark.parametrize("prior", [0.1, 1 / 3, 2.5])
def test_small_tables_lgamma_sums_are_the_kernels_bit_for_bit(shape, prior):
    """A small count table's ``sum_k lgamma(n + prior) - lgamma(prior)`` is
    numpy's (no compile); the kernel's for large tables gives the same
    bits (negative counts clamped at 0)."""
    counts = np.random.default_rng(1).poisson(2.0, size=shape).astype(np.int32)
    if counts.size:
        counts[0, 0] = -3
    table = gammaln(np.arange((counts.max() if counts.size else 0) + 1) + prior) - gammaln(prior)
    assert counts.size <= _lda_kernels._GATHER_ENTRIES
    by_numpy = _lda_kernels._lgamma_ratio(counts, prior)
    assert by_numpy.tobytes() == _lda_kernels._table_row_sums(counts, table).tobytes()


@pytest.mark.parametrize("shape", [(30, 7, 50), (5, 1, 3), (0, 4, 6)])
def test_small_starting_counts_are_the_kernels(shape):
    """A small fit's starting counts are numpy's bincounts (no compile);
    the kernel's for large tables gives the same integers, added to the
    given arrays."""
    n_docs, K, V = shape
    rng = np.random.default_rng(2)
    doc_ptr = np.concatenate([[0], np.cumsum(rng.integers(0, 9, size=n_docs))]).astype(np.int64)
    words = rng.integers(0, V, size=doc_ptr[-1]).astype(np.int32)
    z = rng.integers(0, K, size=doc_ptr[-1]).astype(np.int32)
    start = (rng.integers(0, 3, size=(n_docs, K)).astype(np.int32), rng.integers(0, 3, size=(V, K)).astype(np.int32),
             rng.integers(0, 3, size=K).astype(np.int64))
    by_numpy = [a.copy() for a in start]
    _lda_kernels.init_counts(doc_ptr, words, z, *by_numpy)
    by_kernel = [a.copy() for a in start]
    _lda_kernels._init_counts(doc_ptr, words, z, *by_kernel)
    for a, b in zip(by_numpy, by_kernel):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert by_numpy[2].sum() == start[2].sum() + doc_ptr[-1]
