"""A multi-layer perceptron trained on the parameter server, one key per layer.

The seed paper's own example: every layer's weights and biases are a table
(a key); each participant pulls all layers, computes the gradient of its
minibatch by backpropagation, pushes each layer's update under that layer's
key, and calls ``clock()``. The servers sum the participants' pushes (the
``sum`` rule), so the table holds the model that all of them improve
together, under SSP(1) staleness.

Run: ``python examples/mlp_per_layer_keys.py`` (a few seconds). It
prints the test accuracy against scikit-learn's ``MLPClassifier`` with the
same layers on the same split.
"""

import time
import warnings

import numpy as np
from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier
from sklearn.preprocessing import StandardScaler

import dask_ps

LAYERS = [64, 64, 32, 10]  # digits: 64 pixels in, 10 classes out
EPOCHS, BATCH, LR = 30, 32, 0.05


def layer_keys(n_layers):
    return [(f"mlp-W{i}", f"mlp-b{i}") for i in range(n_layers)]


def forward(params, X):
    """Activations of every layer (ReLU hidden layers, softmax output)."""
    acts = [X]
    for i, (W, b) in enumerate(params):
        z = acts[-1] @ W + b
        if i < len(params) - 1:
            acts.append(np.maximum(z, 0))
        else:
            z = z - z.max(axis=1, keepdims=True)
            e = np.exp(z)
            acts.append(e / e.sum(axis=1, keepdims=True))
    return acts


def gradients(params, X, Y):
    """Backpropagation of the mean cross-entropy: one (dW, db) per layer."""
    acts = forward(params, X)
    delta = (acts[-1] - Y) / len(X)
    grads = []
    for i in range(len(params) - 1, -1, -1):
        grads.append((acts[i].T @ delta, delta.sum(axis=0)))
        if i:
            delta = (delta @ params[i][0].T) * (acts[i] > 0)
    return grads[::-1]


def train(ctx, part, n_layers, epochs, batch, lr):
    """One participant: pull every layer, push every layer's update, clock."""
    X, Y = part
    rng = np.random.default_rng(ctx.rank)
    keys = layer_keys(n_layers)
    steps = len(X) // batch
    for clock in range(ctx.current_clock, epochs * steps):
        idx = rng.choice(len(X), batch, replace=False)
        params = [(ctx.pull(kw), ctx.pull(kb)) for kw, kb in keys]
        for (kw, kb), (dW, db) in zip(keys, gradients(params, X[idx], Y[idx])):
            # each participant moves the shared model by 1/P of its step
            ctx.push(kw, -lr * dW / ctx.n_participants)
            ctx.push(kb, -lr * db / ctx.n_participants)
        ctx.clock()
    return ctx.rank


def main():
    X, y = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, random_state=0, stratify=y)
    scaler = StandardScaler().fit(X_train)
    X_train, X_test = scaler.transform(X_train), scaler.transform(X_test)
    Y_train = np.eye(10)[y_train]

    with dask_ps.ParameterServer() as ps:  # the embedded cluster (in-process)
        rng = np.random.default_rng(0)
        for (kw, kb), n_in, n_out in zip(layer_keys(len(LAYERS) - 1), LAYERS[:-1], LAYERS[1:]):
            init = rng.normal(scale=np.sqrt(2.0 / n_in), size=(n_in, n_out))  # He initialisation
            ps.create_table(kw, shape=(n_in, n_out), init=init, consistency=dask_ps.SSP(1))
            ps.create_table(kb, shape=(n_out,), consistency=dask_ps.SSP(1))
        n_parts = len(ps.servers)
        parts = [(X_train[i::n_parts], Y_train[i::n_parts]) for i in range(n_parts)]
        t0 = time.perf_counter()
        ps.run(train, ps.client.scatter(parts), n_layers=len(LAYERS) - 1, epochs=EPOCHS, batch=BATCH, lr=LR)
        seconds = time.perf_counter() - t0
        params = [(ps.pull(kw), ps.pull(kb)) for kw, kb in layer_keys(len(LAYERS) - 1)]
        for kw, kb in layer_keys(len(LAYERS) - 1):
            ps.drop_table(kw)
            ps.drop_table(kb)

    accuracy = float((forward(params, X_test)[-1].argmax(axis=1) == y_test).mean())
    t0 = time.perf_counter()
    with warnings.catch_warnings():  # the same fixed epochs as ours: not converged is expected
        warnings.simplefilter("ignore", ConvergenceWarning)
        sk = MLPClassifier(hidden_layer_sizes=LAYERS[1:-1], batch_size=BATCH, learning_rate_init=1e-3,
                           max_iter=EPOCHS, random_state=0).fit(X_train, y_train)
    sk_seconds = time.perf_counter() - t0
    print(f"dask_ps MLP {LAYERS}, {n_parts} participants, one key per layer: "
          f"test accuracy {accuracy:.3f} ({seconds:.1f} s)")
    print(f"scikit-learn MLPClassifier, same layers:                 "
          f"test accuracy {sk.score(X_test, y_test):.3f} ({sk_seconds:.1f} s)")


if __name__ == "__main__":
    main()
