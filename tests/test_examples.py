"""The examples run as a user runs them and print what they promise."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def _run(name, tmp_path, timeout=300):
    path = EXAMPLES / name
    if not path.exists():
        pytest.skip("not a source checkout")
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, cwd=tmp_path,
                         timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_mlp_per_layer_keys(tmp_path):
    out = _run("mlp_per_layer_keys.py", tmp_path)
    ours, theirs = (float(x) for x in re.findall(r"test accuracy ([\d.]+)", out))
    assert ours > 0.9 and ours > theirs - 0.05, out


def test_quickstart(tmp_path):
    """The README's first command: the push/pull fit's loss falls and its
    accuracy is scikit-learn's LogisticRegression's; the estimator's is
    scikit-learn's SGDClassifier's on the same rows (a seeded BSP fit)."""
    out = _run("quickstart.py", tmp_path)
    losses = [float(x) for x in re.findall(r"mean training log-loss ([\d.]+)", out)]
    assert len(losses) == 11 and losses[-1] < losses[0] - 0.1, out
    assert all(b <= a + 0.01 for a, b in zip(losses, losses[1:])), out  # a stable step: no jump
    ours, lr = (float(x) for x in re.search(r"test accuracy: dask_ps ([\d.]+)\s+scikit-learn \w+ ([\d.]+)", out).groups())
    assert ours > lr - 0.01, out
    est, sk = (float(x) for x in re.findall(r"(?:dask_ps|scikit-learn)\s+test accuracy ([\d.]+)", out))
    assert est > sk - 0.01, out
