"""SGD fits' ``coef_``/``intercept_`` over every loss, penalty, learning
rate and averaging, hashed: run it from two trees and compare the files, to
show a change keeps the models bit for bit (issue 35's kernel changes).

272 fits: dense, sparse, float32 and multiclass data; alone (in the calling
process) and with 2 simulated participants (``sgd_sim.simulate_fit``: the
participants' own code, sparse rounds compacted). Writes ``{case: hash/n_iter_}``
as JSON::

    (cd /path/to/old && PYTHONPATH=$PWD python benchmarks/sgd_same_bits.py /tmp/old.json $PWD)
    (cd /path/to/new && PYTHONPATH=$PWD python benchmarks/sgd_same_bits.py /tmp/new.json $PWD)
    python -c "import json; a, b = (json.load(open(f)) for f in ('/tmp/old.json', '/tmp/new.json')); \
print(len(a), 'cases', sum(a[k] != b.get(k) for k in a), 'differ')"

(the second argument: the tree whose ``benchmarks/sgd_sim.py`` to use).
"""

from __future__ import annotations

import hashlib
import json
import sys
import warnings

import numpy as np
import scipy.sparse as sp

from dask_ps.linear_model import SGDClassifier, SGDRegressor

sys.path.insert(0, sys.argv[2] + "/benchmarks")
warnings.filterwarnings("ignore")
from sgd_sim import simulate_fit  # noqa: E402
rng = np.random.RandomState(0)
Xd = rng.randn(600, 8); Xd[:, 3] *= 3
ycls = (Xd[:, 0] + 0.3 * Xd[:, 1] + 0.5 * rng.randn(600) > 0).astype(int)
y3 = np.digitize(Xd[:, 0] + 0.4 * rng.randn(600), [-0.5, 0.5])
yreg = Xd @ rng.randn(8) + 0.1 * rng.randn(600)
Xs = sp.random(600, 300, density=0.05, random_state=1, format="csr"); Xs.data[:] = rng.randn(Xs.nnz)
ys = (np.asarray(Xs @ rng.randn(300)).ravel() > 0).astype(int)
out = {}
def h(est):
    return hashlib.sha256(np.ascontiguousarray(est.coef_).tobytes() + np.ascontiguousarray(est.intercept_).tobytes()).hexdigest()[:16] + f"/{est.n_iter_}"
cases = []
for loss in ["hinge", "log_loss", "modified_huber", "squared_hinge", "perceptron"]:
    for pen in ["l2", "l1", "elasticnet", None]:
        cases.append(("cls", loss, pen, "optimal", False))
for lr in ["constant", "invscaling", "adaptive"]:
    for avg in [False, True, 10]:
        cases.append(("cls", "hinge", "l2", lr, avg))
for loss in ["squared_error", "huber", "epsilon_insensitive", "squared_epsilon_insensitive"]:
    for pen in ["l2", "elasticnet"]:
        cases.append(("reg", loss, pen, "invscaling", False))
cases.append(("pa1", "hinge", None, "pa1", False)); cases.append(("pa2", "hinge", None, "pa2", False))
for kind, loss, pen, lr, avg in cases:
    for data in ("dense", "sparse", "dense32", "multi"):
        if kind != "cls" and data in ("sparse", "multi"):
            continue
        kw = dict(loss=loss, penalty=pen, learning_rate=lr, average=avg, max_iter=8, tol=None, random_state=0)
        if lr in ("constant", "invscaling", "adaptive", "pa1", "pa2"):
            kw["eta0"] = 0.01
        X, y = {"dense": (Xd, ycls), "sparse": (Xs, ys), "dense32": (Xd.astype(np.float32), ycls), "multi": (Xd, y3)}[data]
        if kind == "reg":
            y = yreg
        Est = SGDRegressor if kind == "reg" else SGDClassifier
        for P in (1, 2):
            key = f"{kind}/{loss}/{pen}/{lr}/{avg}/{data}/P{P}"
            try:
                est = Est(**kw).fit(X, y) if P == 1 else simulate_fit(Est(**kw), X, y, n_participants=2)
                out[key] = h(est)
            except Exception as e:
                out[key] = "error " + type(e).__name__ + str(e)[:80]
json.dump(out, open(sys.argv[1], "w"), indent=0, sort_keys=True)
print(len(out), "cases")
