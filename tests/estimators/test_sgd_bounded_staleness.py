"""Step-limited regression under a staleness bound (issue 33).

Under SSP(s) a participant's read may miss the others' last ``s`` rounds;
with the exact mean alone (``81942d2``) each round's table lost what the
reads missed, up to ``s / (s + 1)`` of the progress where steps are small:
huber with a constant rate on text-like rows reached R^2 0.118 under
SSP(1) on four participants where scikit-learn's worst seed is 0.276. The
additive share of the small-step part (``_Participant.additive_share``,
SSP-SGD's delta of Ho et al. 2013) keeps it. Simulated participants
(``benchmarks/sgd_sim.py``): every read as stale as the bound allows.
"""

from __future__ import annotations

import pathlib
import sys
import warnings

import pytest
from sklearn.linear_model import SGDRegressor as SkSGDRegressor
from sklearn.metrics import r2_score

from dask_ps.linear_model import SGDRegressor

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
import sgd_data  # noqa: E402
import sgd_sim  # noqa: E402

SLACK = 0.02  # as benchmarks/sgd_quality.py

# (data shape, parameters): scikit-learn's worst of seeds 0-9 and dask_ps's
# lowest of seeds 0-1 at 4 participants under SSP(1) on 81942d2 (R^2, 8,000 rows).
CASES = {
    "huber-text-constant": ("text", {"loss": "huber", "learning_rate": "constant", "eta0": 0.01}),  # 0.276; 0.118
    "eps-text-optimal": ("text", {"loss": "epsilon_insensitive"}),  # 0.271; 0.187
    "huber-dense-adaptive": ("dense", {"loss": "huber", "learning_rate": "adaptive", "eta0": 0.01}),  # 0.324; 0.190
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_step_limited_regression_under_ssp1_as_good_as_scikit_learns(name):
    shape, params = CASES[name]
    X, y, Xt, yt = sgd_data.make(shape, False, 8000)
    params = dict(params, max_iter=5, tol=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = [r2_score(yt, SkSGDRegressor(random_state=s, **params).fit(X, y).predict(Xt)) for s in range(10)]
        got = [r2_score(yt, sgd_sim.simulate_fit(SGDRegressor(random_state=s, **params), X, y, 4,
                                                 consistency="ssp1").predict(Xt)) for s in range(2)]
    assert min(got) >= min(ref) - SLACK, (name, got, min(ref))
