"""Server-side update rules: how a push is folded into the stored block.

A rule is applied where the data lives. ``apply(param, update, state, rows)``
changes ``param`` in place: ``rows`` is ``None`` for a whole block, or unique
local row indices (duplicates were already summed by the sender). ``state`` is
the rule's per-block state (optimizer moments) created by ``init_state`` and
kept beside the block. All arithmetic goes through the arrays' own namespace
(numpy or cupy), so the same rule runs on CPU and GPU tables.

Optimizer rules treat a push as a *gradient*; their step follows PyTorch's
definitions (see each class). A rule is ``additive`` when two pushes may be
summed before applying them without changing the result (only ``Sum``);
other rules are applied push by push, in order.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable

from dask_ps._backend import namespace


@dataclass(frozen=True)
class UpdateRule:
    name = "base"
    additive = False

    def init_state(self, param) -> dict:
        return {}

    def apply(self, param, update, state: dict, rows=None) -> None:
        if rows is None:
            self._step(param, update, state)
            return
        # Gather the touched rows (and their state), step them, scatter back.
        sub = param[rows]
        sub_state = {k: v[rows] for k, v in state.items()}
        self._step(sub, update, sub_state)
        param[rows] = sub
        for k, v in sub_state.items():
            state[k][rows] = v

    def _step(self, param, grad, state: dict) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def to_msg(self) -> dict:
        return {"rule": self.name, **asdict(self)}

    @staticmethod
    def from_msg(msg: dict) -> "UpdateRule":
        msg = dict(msg)
        cls = RULES[msg.pop("rule")]
        return cls(**msg)


@dataclass(frozen=True)
class Sum(UpdateRule):
    """``param += update`` (the default)."""

    name = "sum"
    additive = True

    def apply(self, param, update, state, rows=None):
        if rows is None:
            param += update
        else:
            param[rows] += update  # rows are unique, so fancy-index += is exact


@dataclass(frozen=True)
class Assign(UpdateRule):
    """``param = update``: last write wins."""

    name = "assign"

    def apply(self, param, update, state, rows=None):
        if rows is None:
            param[...] = update
        else:
            param[rows] = update


@dataclass(frozen=True)
class SGD(UpdateRule):
    """``param -= lr * grad``."""

    lr: float = 0.01
    name = "sgd"

    def _step(self, param, grad, state):
        param -= self.lr * grad


@dataclass(frozen=True)
class Momentum(UpdateRule):
    """Heavy-ball momentum (PyTorch ``SGD(momentum=...)``):
    ``v = momentum * v + grad``; ``param -= lr * v`` (Nesterov: ``lr * (grad + momentum * v)``)."""

    lr: float = 0.01
    momentum: float = 0.9
    nesterov: bool = False
    name = "momentum"

    def init_state(self, param):
        return {"velocity": namespace(param).zeros_like(param)}

    def _step(self, param, grad, state):
        v = state["velocity"]
        v *= self.momentum
        v += grad
        if self.nesterov:
            param -= self.lr * (grad + self.momentum * v)
        else:
            param -= self.lr * v


@dataclass(frozen=True)
class Adagrad(UpdateRule):
    """``G += grad**2``; ``param -= lr * grad / (sqrt(G) + eps)``."""

    lr: float = 0.01
    eps: float = 1e-10
    initial_accumulator_value: float = 0.0
    name = "adagrad"

    def init_state(self, param):
        xp = namespace(param)
        return {"sum_sq": xp.full_like(param, self.initial_accumulator_value)}

    def _step(self, param, grad, state):
        xp = namespace(param)
        g2 = state["sum_sq"]
        g2 += grad * grad
        param -= self.lr * grad / (xp.sqrt(g2) + self.eps)


@dataclass(frozen=True)
class Adam(UpdateRule):
    """Adam (Kingma & Ba) with bias correction, PyTorch's form. The step count
    is kept per row, so row-sparse pushes get "lazy Adam" (a row's moments and
    step advance only when the row is pushed)."""

    lr: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    name = "adam"

    def init_state(self, param):
        xp = namespace(param)
        return {
            "m": xp.zeros_like(param),
            "v": xp.zeros_like(param),
            "step": xp.zeros(param.shape[:1], dtype="int64"),
        }

    def _step(self, param, grad, state):
        xp = namespace(param)
        m, v, step = state["m"], state["v"], state["step"]
        m *= self.beta1
        m += (1 - self.beta1) * grad
        v *= self.beta2
        v += (1 - self.beta2) * grad * grad
        step += 1
        # Per-row bias corrections, broadcast over the row's trailing dims.
        shape = step.shape + (1,) * (param.ndim - 1)
        bc1 = (1 - self.beta1 ** step.astype(param.dtype)).reshape(shape)
        bc2 = (1 - self.beta2 ** step.astype(param.dtype)).reshape(shape)
        param -= self.lr * (m / bc1) / (xp.sqrt(v / bc2) + self.eps)


@dataclass(frozen=True)
class Custom(UpdateRule):
    """Any callable ``fn(param_block, update_block, state)``.

    ``fn`` may change ``param_block`` in place or return the new values.
    ``state`` is a dict kept per block (empty at first; ``fn`` may store
    arrays in it). For a row push ``param_block`` holds only the touched rows
    and ``state["rows"]`` their indices within the block.
    """

    fn: Callable = field(default=None)
    name = "custom"

    def __post_init__(self):
        if not callable(self.fn):
            raise TypeError(f"a custom update rule must be callable, got {self.fn!r}")

    def apply(self, param, update, state, rows=None):
        if rows is None:
            state.pop("rows", None)
            out = self.fn(param, update, state)
            if out is not None:
                param[...] = out
            return
        state["rows"] = rows
        sub = param[rows]
        out = self.fn(sub, update, state)
        param[rows] = sub if out is None else out

    def to_msg(self):
        import cloudpickle

        return {"rule": "custom", "fn": cloudpickle.dumps(self.fn)}

    @staticmethod
    def _from_bytes(fn: bytes) -> "Custom":
        import pickle

        return Custom(pickle.loads(fn))


RULES: dict[str, type[UpdateRule]] = {
    r.name: r for r in (Sum, Assign, SGD, Momentum, Adagrad, Adam, Custom)
}


def as_rule(rule, **hyper) -> UpdateRule:
    """Accept a rule object, a name (with hyper-parameters), or a callable."""
    if isinstance(rule, UpdateRule):
        if hyper:
            raise TypeError("pass hyper-parameters to the rule object, not next to it")
        return rule
    if isinstance(rule, str):
        key = rule.lower()
        if key not in RULES or key == "custom":
            raise ValueError(
                f"unknown update rule {rule!r}; expected one of "
                f"{sorted(k for k in RULES if k != 'custom')} or a callable"
            )
        try:
            return RULES[key](**hyper)
        except TypeError as e:
            raise TypeError(f"bad hyper-parameters for rule {rule!r}: {e}") from None
    if callable(rule):
        return Custom(rule)
    raise TypeError(f"rule must be a rule name, an UpdateRule or a callable, got {rule!r}")


def rule_from_msg(msg: dict) -> UpdateRule:
    if msg["rule"] == "custom":
        return Custom._from_bytes(msg["fn"])
    return UpdateRule.from_msg(msg)
