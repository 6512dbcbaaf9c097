"""examples/topics.py runs as a user runs it and prints what it promises."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "topics.py"


def test_topics_example(tmp_path):
    pytest.importorskip("lda")
    if not EXAMPLE.exists():
        pytest.skip("not a source checkout")
    out = subprocess.run([sys.executable, str(EXAMPLE), "--topics", "10", "--iterations", "150"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert len(re.findall(r"^\s+\d+  \S+( \S+){7}$", text, flags=re.M)) == 10, text  # 8 top words per topic
    # verbose: scikit-learn's line per iteration, the evaluations' with the perplexity and dask_ps's details
    assert len(re.findall(r"^iteration: \d+ of max_iter: 150", text, flags=re.M)) == 150, text
    assert re.search(r"^iteration: 111 of max_iter: 150, perplexity: \d+\.\d{4} \(log-likelihood", text,
                     flags=re.M), text
    ours, theirs = (float(x) for x in re.findall(r"(-\d+\.\d+) nats/token", text))
    assert abs(ours - theirs) / abs(theirs) < 0.03, text  # held-out quality of scikit-learn's LDA
    assert "score" in text and "perplexity" in text
