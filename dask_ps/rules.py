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

Custom rules are code. A callable passed as ``rule`` travels to the workers
as a pickle (:class:`Custom`), which is Dask's own trust model: whoever can
reach the cluster's comm can run code on it. A cluster that wants no
pickled rules sets ``ps.allow-pickled-rules: false`` and registers its
rules by name in the workers' own code (:func:`register_rule`, e.g. in a
``--preload`` module); a table then names its rule (``rule="clipped_sum"``)
and only the name travels (:class:`Registered`). See ``docs/security.rst``.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field
from typing import Callable

import dask.config

from dask_ps._backend import add_rows, namespace
from dask_ps._sparse_rows import RowsToAdd


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

    def check_available(self) -> None:
        """Raise unless this process can apply the rule (a worker creating a
        table's blocks calls it: a rule registered by name must be registered
        here)."""

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
        if isinstance(update, RowsToAdd):  # only their nonzeros written (_sparse_rows)
            update.add_to(param, rows)
        elif rows is None:
            param += update
        else:
            add_rows(param, rows, update)  # rows are unique


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


# Rules registered by name in this process (register_rule): name -> callable.
_REGISTERED: dict[str, Callable] = {}
_registry_lock = threading.Lock()


def register_rule(name: str, fn: Callable, *, replace: bool = False) -> None:
    """Register a custom update rule under ``name`` in this process.

    A table created with ``rule=name`` sends only the name; every worker
    that hosts its blocks must have registered the same rule (register it
    in code the workers run at start, e.g. a module passed to
    ``dask worker --preload``, or an installed package they import). The
    client needs it registered too to pass the plain name, or it passes
    ``dask_ps.rules.Registered(name)``.

    Parameters
    ----------
    name : str
        Not one of the built-in rule names.
    fn : callable
        ``fn(param_block, update_block, state)``, as for :class:`Custom`.
    replace : bool, default False
        Replace a different function registered under ``name``.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"a rule name must be a non-empty str, got {name!r}")
    if name.lower() in RULES:
        raise ValueError(f"{name!r} is a built-in rule name; choose another")
    if not callable(fn):
        raise TypeError(f"rule {name!r} must be callable, got {fn!r}")
    with _registry_lock:
        have = _REGISTERED.get(name)
        if have is not None and have is not fn and not replace:
            raise ValueError(f"rule {name!r} is already registered (to {have!r}); pass replace=True")
        _REGISTERED[name] = fn


def unregister_rule(name: str) -> None:
    """Forget a rule registered with :func:`register_rule` (tables using it
    can no longer be created or updated in this process)."""
    with _registry_lock:
        _REGISTERED.pop(name, None)


def registered_rules() -> list[str]:
    """Names of the rules registered in this process."""
    return sorted(_REGISTERED)


@dataclass(frozen=True)
class Registered(UpdateRule):
    """A custom rule registered by name with :func:`register_rule`: only its
    name travels, and each worker applies the function registered under
    that name in its own process (as :class:`Custom` would)."""

    rule_name: str = ""
    name = "registered"

    def __post_init__(self):
        if not isinstance(self.rule_name, str) or not self.rule_name:
            raise TypeError(f"a registered rule needs a name, got {self.rule_name!r}")

    def _fn(self):
        fn = _REGISTERED.get(self.rule_name)
        if fn is None:
            raise LookupError(
                f"update rule {self.rule_name!r} is not registered in this process (registered: "
                f"{registered_rules()}); call dask_ps.rules.register_rule({self.rule_name!r}, fn) on every "
                "worker at start (e.g. in a --preload module)"
            )
        return fn

    def check_available(self) -> None:
        self._fn()

    def apply(self, param, update, state, rows=None):
        Custom(self._fn()).apply(param, update, state, rows)


RULES: dict[str, type[UpdateRule]] = {
    r.name: r for r in (Sum, Assign, SGD, Momentum, Adagrad, Adam, Custom, Registered)
}


def as_rule(rule, **hyper) -> UpdateRule:
    """Accept a rule object, a name (with hyper-parameters), or a callable."""
    if isinstance(rule, UpdateRule):
        if hyper:
            raise TypeError("pass hyper-parameters to the rule object, not next to it")
        return rule
    if isinstance(rule, str):
        key = rule.lower()
        if rule in _REGISTERED and key not in RULES:
            if hyper:
                raise TypeError(f"rule {rule!r} is registered by name: it takes no hyper-parameters")
            return Registered(rule)
        if key not in RULES or key in ("custom", "registered"):
            raise ValueError(
                f"unknown update rule {rule!r}; expected one of "
                f"{sorted(k for k in RULES if k not in ('custom', 'registered'))}, a rule registered "
                f"with dask_ps.rules.register_rule (here: {registered_rules()}), or a callable"
            )
        try:
            return RULES[key](**hyper)
        except TypeError as e:
            raise TypeError(f"bad hyper-parameters for rule {rule!r}: {e}") from None
    if callable(rule):
        return Custom(rule)
    raise TypeError(f"rule must be a rule name, an UpdateRule or a callable, got {rule!r}")


def pickled_rules_allowed() -> bool:
    """``ps.allow-pickled-rules`` of this process (default True)."""
    v = dask.config.get("ps.allow-pickled-rules", True)
    if isinstance(v, str):
        return v.strip().lower() not in ("0", "false", "no", "off")
    return bool(v)


def rule_from_msg(msg: dict) -> UpdateRule:
    if msg["rule"] == "custom":
        if not pickled_rules_allowed():
            # Refused before unpickling anything.
            from dask_ps._exceptions import PSValueError

            raise PSValueError(
                "a custom update rule sent as a pickle is refused here (ps.allow-pickled-rules is false): "
                "register the rule by name with dask_ps.rules.register_rule on every worker and create "
                "the table with rule=<its name> (see docs/security.rst)"
            )
        return Custom._from_bytes(msg["fn"])
    return UpdateRule.from_msg(msg)
