"""SGD under bounded staleness gives scikit-learn's answers (issue 21).

The quality sweep (``benchmarks/sgd_quality.py``): every dask_ps fit scores
at least scikit-learn's worst of seeds 0-29 minus 0.02 (sgd_quality.REFERENCE_SEEDS: why) (test accuracy, or
test R^2), with the participants a user gets, under the default consistency
(BSP for the SGD estimators) and, for the cases that failed on 8f17103,
under SSP(2) too. The default run has a small sweep; ``-m slow`` the wide
one (losses x schedules x dense/sparse x 1k/20k/200k rows x 2 and 4 workers
x ``max_iter`` 1-10, seeds 0-9).

What it caught on ``8f17103`` (the rule that pushed ``(W - read) / P``, one
round an epoch on these inputs): the default classifier at ``max_iter=5``
scored 0.474 in 4 of 30 fits; ``modified_huber`` down to 0.103; the default
regressor R^2 0.43 in every fit at ``max_iter=3`` (a model 1.75x the right
length), and -0.71 on four workers; BSP fits on sparse data with the
``invscaling`` steps half a sequential epoch's progress. Each of these
cases is in the small sweep.

Also here: the regressor's length under the default consistency against
BSP's, and BSP fits reproducible bit for bit (SGD; LDA in
``tests/decomposition/test_lda_dropin.py``).

Issue 33's sweep (``sgd_quality.py --quick``): what it covers and how it
judges (default run), and, ``-m slow``, its settings at 1-64 simulated
participants under the default (every fit at scikit-learn's worst - 0.02,
stopping within 2 epochs of its range) and its classifiers under SSP(1) and
SSP(3), as ``docs/benchmarks.md`` states.
"""

from __future__ import annotations

import pathlib
import sys
import warnings

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster

import dask_ps
from dask_ps.linear_model import SGDClassifier, SGDRegressor

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
import sgd_data  # noqa: E402
import sgd_quality  # noqa: E402
from sgd_quality import Case  # noqa: E402


@pytest.fixture(scope="module", params=[2, 4], ids=["2-workers", "4-workers"])
def workers(request):
    """A threads cluster of 2 or 4 workers (as the embedded default)."""
    with LocalCluster(n_workers=request.param, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster, Client(cluster, set_as_default=False) as client:
        yield client, request.param


@pytest.fixture
def forced():
    """One participant per worker whatever the input's size."""
    with dask.config.set({"ps.sgd.min-samples-per-participant": 100}):
        yield


def _assert_case(case, seeds, client, **extra):
    r = sgd_quality.run_case(case, seeds, client, **extra)
    assert r["ok"], (f"{case}: dask_ps {np.round(r['dask_ps'], 4).tolist()} against scikit-learn's "
                     f"{np.round(r['sklearn'], 4).tolist()} (worst - {sgd_quality.SLACK})")
    return r


def _id(c):
    return f"{c.loss}-{c.schedule}-{'sparse' if c.sparse else 'dense'}-{c.n_rows}-E{c.max_iter}"


# Each (loss, schedule, sparse, rows, max_iter) failed on 8f17103 or is its neighbour.
SMALL = [
    Case("hinge", "optimal", False, 20000, 5),
    Case("log_loss", "optimal", True, 20000, 1),
    Case("modified_huber", "optimal", False, 20000, 6),
    Case("log_loss", "constant", True, 20000, 3),
    Case("squared_error", "invscaling", False, 20000, 3),
    Case("squared_error", "invscaling", True, 20000, 10),
    Case("huber", "adaptive", True, 20000, 2),
]


@pytest.mark.parametrize("consistency", [None, dask_ps.SSP(2)], ids=["default", "SSP2"])
@pytest.mark.parametrize("case", SMALL, ids=_id)
def test_quality_small_sweep(workers, case, consistency):
    """The participants a user gets, under the default consistency (BSP)
    and under SSP(2), where these cases failed on 8f17103."""
    client, n = workers
    _assert_case(case, range(3), client, consistency=consistency)


# Small steps and bounded gradients (huber's epsilon): a sequential epoch
# moves the model little, and a read that misses the others' last round
# starts a participant from an older mean. Under SSP(2) (refresh or not) these
# fits made 75-95% of scikit-learn's progress (R^2 0.50-0.65 against 0.663
# at E=5); under BSP, the default, they match it.
STEP_LIMITED = [
    Case("huber", "constant", False, 20000, 5),
    Case("huber", "invscaling", False, 20000, 5),
]


@pytest.mark.parametrize("case", STEP_LIMITED, ids=_id)
def test_quality_step_limited_fits_under_the_default(workers, case):
    client, n = workers
    _assert_case(case, range(3), client)


# Tiny parts: a participant's round is a few dozen samples, where a model
# trained on 1/P of them and averaged makes 1/P of the progress unless its
# steps are P times larger (_kernels.sample_scale). Under BSP: under SSP(2) rounds
# that short read the others' last round late and progress less
# (docs/architecture.rst, "what a read may miss").
TINY = [
    Case("hinge", "invscaling", False, 1000, 1),
    Case("log_loss", "invscaling", False, 1000, 3),
    Case("squared_error", "adaptive", True, 1000, 3),
    Case("huber", "invscaling", False, 1000, 1),
]


@pytest.mark.parametrize("case", TINY, ids=_id)
def test_quality_one_participant_per_worker_on_tiny_inputs(workers, forced, case):
    client, n = workers
    _assert_case(case, range(3), client, consistency=dask_ps.BSP())


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a 200,000-row case: ~5 minutes on 2 cores (ten seeds, four schedules, E = 1-10)
@pytest.mark.parametrize("n_rows", [1000, 20000, 200000])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("loss", sgd_quality.CLASSIFIER_LOSSES + sgd_quality.REGRESSOR_LOSSES)
def test_quality_wide_sweep(workers, loss, sparse, n_rows):
    client, n = workers
    bad = []
    for schedule in sgd_quality.SCHEDULES:
        for E in range(1, 11):
            r = sgd_quality.run_case(Case(loss, schedule, sparse, n_rows, E), range(10), client)
            if not r["ok"]:
                bad.append((schedule, E, min(r["dask_ps"]), r["worst"]))
    assert not bad, bad


def test_default_tol_fits_like_scikit_learn(workers):
    """With scikit-learn's default ``tol`` (the stopping rule decides from the
    objective summed over all participants)."""
    client, n = workers
    X, y, Xt, yt = sgd_quality.data(True, False, 20000)
    from sklearn.linear_model import SGDClassifier as Sk

    sk = [Sk(random_state=s).fit(X, y).score(Xt, yt) for s in range(3)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = [SGDClassifier(random_state=s, client=client).fit(X, y).score(Xt, yt) for s in range(3)]
    assert min(got) >= min(sk) - sgd_quality.SLACK, (got, sk)


def test_regressor_length_matches_bsp(workers, forced):
    """The model's length under SSP(2) (the default on 8f17103, and the
    tables' default) within 2% of BSP's on the same data: a table that
    drifted from the mean of the models towards their sum was 1.75x long on
    8f17103 (R^2 0.43)."""
    client, n = workers
    X, y, _, _ = sgd_quality.data(False, False, 20000)
    kw = dict(max_iter=3, tol=None, client=client)
    for seed in range(3):
        default = SGDRegressor(random_state=seed, consistency=dask_ps.SSP(2), **kw).fit(X, y)
        bsp = SGDRegressor(random_state=seed, consistency=dask_ps.BSP(), **kw).fit(X, y)
        ratio = np.linalg.norm(default.coef_) / np.linalg.norm(bsp.coef_)
        assert abs(ratio - 1.0) <= 0.02, (seed, ratio)


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("estimator", ["classifier", "regressor"])
def test_bsp_fits_are_reproducible(workers, forced, estimator, sparse):
    """Five fits at the default consistency (BSP) with the same
    ``random_state`` on the same workers: the same ``coef_`` and
    ``intercept_`` bytes (the servers sum each clock's pushes in the
    participants' order, ``aggregate="clock"``). On 8f17103 BSP
    coefficients differed by up to 24% from one fit to the next."""
    client, n = workers
    classifier = estimator == "classifier"
    X, y, _, _ = sgd_quality.data(classifier, sparse, 20000)
    cls = SGDClassifier if classifier else SGDRegressor
    fits = [cls(max_iter=3, tol=None, random_state=0, client=client).fit(X, y) for _ in range(5)]  # default: BSP
    assert len(fits[0].metrics_) == n  # one participant per worker
    for f in fits[1:]:
        assert f.coef_.tobytes() == fits[0].coef_.tobytes()
        assert f.intercept_.tobytes() == fits[0].intercept_.tobytes()


# --- the sweep over the space (issue 33; benchmarks/sgd_quality.py --quick / --full) ---------


def _options(cls, name):
    (opt,) = [c for c in cls._parameter_constraints[name] if hasattr(c, "options")]
    return set(opt.options)


@pytest.mark.parametrize("full", [False, True], ids=["quick", "full"])
def test_the_sweep_covers_the_space(full):
    """Every loss of scikit-learn's SGD (its own list: a loss it adds fails
    this), penalty, schedule, alpha 1e-6..1e-2, average, class_weight,
    sample_weight, early_stopping, the default stopping rule, every data
    shape; the full sweep every loss under every schedule."""
    from sklearn.linear_model import SGDClassifier as SkC
    from sklearn.linear_model import SGDRegressor as SkR

    sets = sgd_quality.settings(full)
    kw = [s.kwargs() for s in sets]
    assert {k.get("loss", "hinge") for s, k in zip(sets, kw) if s.classifier} == _options(SkC, "loss")
    assert {k.get("loss", "squared_error") for s, k in zip(sets, kw) if not s.classifier} == _options(SkR, "loss")
    assert {k.get("penalty", "l2") for k in kw} == _options(SkC, "penalty") | {None}
    assert {k.get("learning_rate", "optimal") for k in kw} >= _options(SkC, "learning_rate") - {"pa1", "pa2"}
    assert {k.get("alpha", 1e-4) for k in kw} >= {1e-6, 1e-4, 1e-2}
    assert {k.get("average") for k in kw} >= {True, 10}
    assert any(k.get("class_weight") == "balanced" for k in kw) and any(s.weighted for s in sets)
    assert any(k.get("early_stopping") for k in kw) and any(s.stops and "max_iter" not in k for s, k in zip(sets, kw))
    assert {s.shape for s in sets} == set(sgd_data.SHAPES)
    if full:
        grid = {(s.classifier, k.get("loss"), k.get("learning_rate")) for s, k in zip(sets, kw) if s.axis == "loss"}
        assert len(grid) == 4 * (len(_options(SkC, "loss")) + len(_options(SkR, "loss")))
    assert sgd_quality.PARTICIPANTS == (1, 2, 4, 16, 64)


def test_the_known_bad_cells_are_settings_of_the_sweep():
    names = {" ".join(s.name.split()) for s in sgd_quality.quick_settings()}
    assert set(KNOWN_BAD) <= names, set(KNOWN_BAD) - names


def test_the_verdict():
    """Bad: below scikit-learn's worst - SLACK; a regressor whose
    scikit-learn fits reach R^2 <= 0 is not judged; under a stopping rule,
    epochs outside scikit-learn's range +- STOP_SLACK are counted."""
    st = sgd_quality.S("stopping", "text", True)
    ref = {"scores": [0.70, 0.72], "epochs": [10, 14]}
    v = sgd_quality.judge(st, ref, [0.69, 0.679, 0.75], [8, 17, 7])
    assert (v["bad"], v["stop_off"], v["judged"]) == (1, 2, True)
    r = sgd_quality.S("loss", "text", False, **sgd_quality._fixed())
    v = sgd_quality.judge(r, {"scores": [-3.0, 0.2], "epochs": [5, 5]}, [-9.0], [5])
    assert (v["bad"], v["stop_off"], v["judged"]) == (0, 0, False)


@pytest.mark.parametrize("early_stopping", [False, True], ids=["objective", "validation"])
def test_stop_rule_replay_gives_the_estimators_epochs(early_stopping):
    """``sgd_stop_rules`` replays stopping rules on the per-epoch values a
    fit kept from stopping records; scikit-learn's rule replayed must stop
    where the estimator's own rule stops (BSP: the trajectory does not
    depend on the rule until it stops)."""
    import sgd_sim
    import sgd_stop_rules

    st = sgd_quality.S("stopping", "dense", True, early_stopping=early_stopping, tol=0.05)
    values = sgd_stop_rules.record(st, 2000, 4, 0, cap=60)
    X, y, _, _ = sgd_data.make("dense", True, 2000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = sgd_sim.simulate_fit(SGDClassifier(random_state=0, max_iter=60, tol=0.05, early_stopping=early_stopping),
                                   X, y, n_participants=4)
    assert len(values) == 60
    assert sgd_stop_rules.sklearn_rule(values, early_stopping, tol=0.05) == est.n_iter_ < 60


def test_data_shapes_are_what_they_say():
    X, y, Xt, yt = sgd_data.make("sorted", True, 2000)
    assert np.all(np.diff(y) >= 0) and not np.all(np.diff(yt) >= 0)
    X, y, _, _ = sgd_data.make("heavy", True, 2000)
    sq = np.asarray(X.multiply(X).sum(axis=1)).ravel()
    assert np.percentile(sq, 99) / np.percentile(sq, 1) > 20  # squared row norms over decades
    X, y, _, _ = sgd_data.make("tfidf", False, 2000)
    assert np.allclose(np.asarray(X.multiply(X).sum(axis=1)).ravel(), 1.0)
    X, y, _, _ = sgd_data.make("imbalanced", True, 2000)
    assert 0.03 < y.mean() < 0.08
    X, y, _, _ = sgd_data.make("ctr", True, 2000)
    assert X.shape[1] == 2 ** 18 and np.all(np.diff(X.indptr) <= 16) and 0.05 < y.mean() < 0.3
    a = sgd_data.make("text", False, 2000)
    sgd_data._CACHE.clear()
    b = sgd_data.make("text", False, 2000)
    assert (a[0] != b[0]).nnz == 0 and np.array_equal(a[1], b[1])


def _sweep_cell(setting, P, consistency, seeds=range(2)):
    ref = _REFS.get(setting)
    if ref is None:
        ref = _REFS[setting] = sgd_quality.sklearn_reference(setting, _SWEEP_ROWS, range(sgd_quality.REFERENCE_SEEDS))
    cap = sgd_quality.epoch_cap(setting, ref)
    fits = [sgd_quality.dask_ps_fit(setting, _SWEEP_ROWS, s, P, consistency, max_iter=cap) for s in seeds]
    return sgd_quality.judge(setting, ref, [f[0] for f in fits], [f[1] for f in fits])


_REFS: dict = {}
_SWEEP_ROWS = 8000  # the quick sweep's


def _sid(s):
    return "-".join(s.name.split())


# The cells of the quick sweep still bad under BSP (docs/benchmarks.md,
# "SGD quality over issue 33's space", the table "still bad"): setting name
# -> the P at which it loses (a score below scikit-learn's worst - 0.02, or
# a stopping rule more than 2 epochs off). Stated, not asserted; every
# other cell is.
KNOWN_BAD = {
    # moderate own steps (raw word counts, constant 0.01): the mean of P
    # models makes f/P of a sequential pass's progress; 64 participants of
    # 125 rows (remeasured 2026-12-07 at BSP's one round an epoch: the cells
    # at P = 2, 4 and 16 that were here now pass)
    "R text eta0=0.01 learning_rate=constant loss=squared_error max_iter=5": (64,),
    "R text eta0=0.01 learning_rate=constant max_iter=5 penalty=None": (64,),
    "R text eta0=0.01 learning_rate=constant loss=epsilon_insensitive max_iter=5": (64,),
    "R text average=10 eta0=0.01 learning_rate=constant max_iter=5": (4, 16, 64),
    "R heavy eta0=0.01 learning_rate=constant max_iter=10": (64,),
    "R sorted max_iter=1": (64,),
    # the stopping rule's epochs
    "R text early_stopping=True tol=1e-3": (64,),
    "R dense loss=epsilon_insensitive tol=1e-3": (16, 64),
    "C ctr tol=1e-3": (2, 16, 64),
}


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("setting", sgd_quality.quick_settings(), ids=_sid)
def test_sweep_under_the_default(setting):
    """The quick sweep's settings at 1, 2, 4, 16 and 64 participants
    (simulated: ``benchmarks/sgd_sim.py``, the cluster's fit bit for bit at
    2 and 4) under the default consistency (BSP): no fit below
    scikit-learn's worst of 30 seeds - 0.02, and under a stopping rule none
    stopping more than 2 epochs outside scikit-learn's range, except the
    cells ``KNOWN_BAD`` states."""
    bad = {}
    known = KNOWN_BAD.get(" ".join(setting.name.split()), ())
    for P in sgd_quality.PARTICIPANTS:
        if P in known:
            continue
        v = _sweep_cell(setting, P, "bsp")
        if v["bad"] or v["stop_off"]:
            bad[P] = (v["scores"], v["epochs"])
    assert not bad, (f"scikit-learn worst {min(_REFS[setting]['scores']):.4f}, epochs "
                     f"{min(_REFS[setting]['epochs'])}-{max(_REFS[setting]['epochs'])}: {bad}")


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("consistency", ["ssp1", "ssp3"])
@pytest.mark.parametrize("setting", [s for s in sgd_quality.quick_settings() if s.classifier], ids=_sid)
def test_sweep_classifiers_under_bounded_staleness(setting, consistency):
    """What docs/benchmarks.md ("SGD quality over issue 33's space") states
    of bounded staleness: under SSP(1) and SSP(3), at 4 and 64 participants
    (the worst case the bound allows: ``sgd_sim``), no classifier fit of the
    quick sweep below scikit-learn's worst - 0.02. (Regressors are stated
    to lose there: step-limited losses and schedules, and most regression at
    64 participants; not asserted.) On 1322df5 the averaged log_loss text
    classifier fell to 0.55 at 64 participants (bar 0.68)."""
    bad = {}
    for P in (4, 64):
        v = _sweep_cell(setting, P, consistency)
        if v["bad"]:
            bad[P] = v["scores"]
    assert not bad, f"scikit-learn worst {min(_REFS[setting]['scores']):.4f}: {bad}"


@pytest.mark.parametrize("layout", ["sim", "threads"])
def test_the_reachable_sweep_gives_each_p_its_rows(tmp_path, capsys, layout):
    """``--rows-per-participant N``: each P on P x N rows (the layouts a
    user reaches), scikit-learn's reference on the same rows, a table per P
    and the JSON of every P; ``--layout threads``: P = 2 on a cluster of 2
    workers (``dask_ps_fit`` asserts its 2 participants)."""
    import argparse
    import json

    st = sgd_quality.S("loss", "dense", True, loss="hinge", **sgd_quality._fixed(1))
    args = argparse.Namespace(rows_per_participant=300, json=str(tmp_path / "reach.json"), layout=layout)
    sgd_quality.reachable_sweep([st], (1, 2), ("bsp",), range(1), 2, args)
    out = capsys.readouterr().out
    assert "P=1: 1 settings, 300 rows" in out and "P=2: 1 settings, 600 rows" in out
    assert f"P=2: 1 settings, 600 rows, 1 seeds, scikit-learn's worst of 2 - 0.02; layout {layout}" in out
    assert "-inf" not in out  # the fit did not fail (a failed fit scores -inf)
    assert "P=2, 600 rows:" in out and "| P=2 BSP |" in out
    saved = json.load(open(args.json))
    assert sorted(saved) == ["1", "2"]
    assert list(saved["2"]["sweep"][0]["cells"]) == ["2-bsp"]
    assert saved["2"]["sweep"][0]["cells"]["2-bsp"]["n"] == 1


def test_the_spread_script_says_how_many_fits_fall_below(monkeypatch, capsys):
    """``sgd_spread.py``: one setting, scikit-learn's worst over its seeds,
    and per consistency dask_ps's worst and the count below the bar."""
    import sgd_spread

    monkeypatch.setattr(sys, "argv", ["sgd_spread.py", "C dense3 max_iter=1", "--layout", "sim", "--seeds", "2",
                                      "--ref-seeds", "3", "--rows-per-participant", "500",
                                      "--consistencies", "bsp", "ssp1:nocatch"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sgd_spread.main()
    out = capsys.readouterr().out
    assert "1000 rows; scikit-learn 3 seeds: worst" in out
    assert "bsp            2 seeds: worst" in out and "ssp1:nocatch   2 seeds: worst" in out
    assert "-inf" not in out
