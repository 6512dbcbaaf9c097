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
