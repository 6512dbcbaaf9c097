"""``examples/ctr_logistic.py`` runs as a user runs it and prints what it
promises: the test ROC AUC of dask_ps's and scikit-learn's SGDClassifier on
hashed click-through data, and their fit times (a smaller data set here)."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "ctr_logistic.py"


def test_ctr_logistic_example(tmp_path):
    if not EXAMPLE.exists():
        pytest.skip("not a source checkout")
    # On this small sample each participant has one round per epoch, and under
    # SSP(2) the one-epoch AUC varies (0.62-0.77): more rounds per epoch
    # (opt-in, docs/benchmarks.md) keep it at 0.755-0.764.
    env = dict(os.environ, DASK_PS__SGD__MIN_ROUNDS_PER_EPOCH="4")
    out = subprocess.run([sys.executable, str(EXAMPLE), "--rows", "40000", "--epochs", "5"], capture_output=True,
                         text=True, cwd=tmp_path, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {name.strip(): [float(v) for v in values.split()]
            for name, values in re.findall(r"^(scikit-learn SGDClassifier|dask_ps SGDClassifier \(2 workers\))"
                                           r"\s+([\d.\s]+)$", out.stdout, re.M)}
    assert len(rows) == 2, out.stdout
    (sk_seconds, _, sk_auc, _), (ps_seconds, _, ps_auc, _) = rows["scikit-learn SGDClassifier"], \
        rows["dask_ps SGDClassifier (2 workers)"]
    # A smoke test of the example (parity is tests/linear_model/test_sgd_parity.py's): on this small
    # sample, two participants under SSP(2) end 0.66-0.77 from run to run (scikit-learn: 0.73).
    assert ps_auc > 0.6 and ps_auc > sk_auc - 0.1, out.stdout
    assert "the model that made the clicks" in out.stdout and "ConvergenceWarning" not in out.stderr, out.stderr
