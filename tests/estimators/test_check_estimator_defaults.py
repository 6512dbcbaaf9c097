"""scikit-learn's ``check_estimator`` on each estimator at its defaults
(``client=None``: the embedded cluster; the default consistency): no check
fails that does not fail for scikit-learn's own estimator of the same name
(issue 21).

On 8f17103 LatentDirichletAllocation() failed ``check_fit_idempotent``: its
default SSP(2) made two fits of the same tiny input differ. A small corpus
now gets one participant (``ps.lda.min-tokens-per-participant``), which is
reproducible under any model; SGD inputs under
``ps.sgd.min-samples-per-participant`` train on one participant too.
scikit-learn's own SGD estimators fail the two sample-weight equivalence
checks (SGD's order of samples changes when samples are repeated), and so
do ours.
"""

from __future__ import annotations

import warnings

import pytest
from sklearn import decomposition as sk_decomposition
from sklearn import linear_model as sk_linear_model
from sklearn.utils.estimator_checks import check_estimator

from dask_ps.decomposition import LatentDirichletAllocation
from dask_ps.linear_model import SGDClassifier, SGDRegressor


def _failed(estimator) -> set[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = check_estimator(estimator, on_fail=None)
    assert results, "no check ran"
    return {r["check_name"] for r in results if r["status"] == "failed"}


@pytest.mark.parametrize("ours, theirs", [
    (LatentDirichletAllocation, sk_decomposition.LatentDirichletAllocation),
    (SGDClassifier, sk_linear_model.SGDClassifier),
    (SGDRegressor, sk_linear_model.SGDRegressor),
], ids=["LatentDirichletAllocation", "SGDClassifier", "SGDRegressor"])
def test_check_estimator_at_the_defaults_no_worse_than_scikit_learn(ours, theirs):
    failed, reference = _failed(ours()), _failed(theirs())
    assert failed <= reference, f"failed here only: {sorted(failed - reference)}"
