"""Consistency models of a table (Petuum's, from "Consistent Bounded-Asynchronous
Parameter Servers for Distributed ML", Wei et al.).

A participant's clock ``c`` is the number of ``ctx.clock()`` calls it has made.
Each model says which updates a read at clock ``c`` is guaranteed to contain:

=========  =================================================================
BSP        every update of every participant made at clocks ``< c``
SSP(s)     every update made at clocks ``< c - s``, and all of the reader's own
ESSP(s)    as SSP(s); fresh rows are sent to readers' caches after each clock
VAP(v)     updates not yet visible to all sum to at most ``v`` per element
CVAP(s,v)  both SSP(s) and VAP(v)
ASP        the reader's own updates only; never waits
=========  =================================================================

``SSP(s, refresh=True)`` and ``ESSP(s, refresh=True)`` keep the same guarantee
and add a freshness one: the first read of a block in each clock goes to the
servers (like ASP's once-per-clock re-read), so it also contains every update
that was on the servers at that moment; it still waits only when the bound
requires it. Without ``refresh`` a cached copy that satisfies the bound is
served however old it is.

The objects here are plain frozen descriptions; the session enforces them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import dask.config


@dataclass(frozen=True)
class Consistency:
    """Base class: a consistency model is a frozen value object."""

    name = "base"

    @property
    def staleness(self) -> int | None:  # overridden by clocked models
        return None

    @property
    def value_bound(self) -> float | None:
        return None

    @property
    def refreshes(self) -> bool:
        """Whether the first read of a block in each clock goes to the servers
        (``refresh=True`` of the clock-bounded models)."""
        return bool(getattr(self, "refresh", False))

    def to_msg(self) -> dict:
        return {"model": self.name, **asdict(self)}

    @staticmethod
    def from_msg(msg: dict) -> "Consistency":
        msg = dict(msg)
        cls = MODELS[msg.pop("model")]
        # Messages written before a field existed (e.g. ``refresh``) omit it:
        # the field's default applies.
        return cls(**msg)


@dataclass(frozen=True)
class BSP(Consistency):
    """Bulk-synchronous: a read at clock ``c`` sees all updates of clocks ``< c``."""

    name = "bsp"

    @property
    def staleness(self) -> int:
        return 0


@dataclass(frozen=True)
class SSP(Consistency):
    """Stale-synchronous parallel with staleness bound ``staleness`` (``s``).

    Parameters
    ----------
    staleness : int, default 2
        A read at clock ``c`` sees every update made at clocks ``< c - s``
        (and all of the reader's own); a participant is never more than ``s``
        clocks ahead of the slowest live one.
    refresh : bool, default False
        "Fresh when cheap": the first read of a block in each clock fetches
        it from its server even when the cached copy satisfies the bound, so
        it also sees every update that was on the server at that moment.
        The read still waits only when the bound requires it (the run's min
        clock ``< c - s``). Later reads in the same clock use that copy plus
        the reader's own writes. Costs one fetch per block per clock; pays
        off when the fresher values matter more than the round trip (Gibbs
        sampling, SGD with large steps).
    """

    staleness: int = 2
    refresh: bool = False
    name = "ssp"

    def __post_init__(self):
        _check_staleness(self.staleness)
        _check_refresh(self.refresh)


@dataclass(frozen=True)
class ESSP(Consistency):
    """Eager SSP: the SSP bound, plus servers push fresh rows after each clock.

    Parameters
    ----------
    staleness : int, default 2
        The SSP bound ``s``.
    refresh : bool, default False
        As for :class:`SSP`: the first read of a block in each clock goes to
        the servers. Rows the servers push later in the clock replace that
        copy only if they are at least as new (by the block's sequence
        number), so they can only make later reads of the clock fresher.
    """

    staleness: int = 2
    refresh: bool = False
    name = "essp"

    def __post_init__(self):
        _check_staleness(self.staleness)
        _check_refresh(self.refresh)


@dataclass(frozen=True)
class VAP(Consistency):
    """Value-bounded asynchronous parallel with per-element bound ``bound``."""

    bound: float = 1.0
    name = "vap"

    def __post_init__(self):
        _check_bound(self.bound)

    @property
    def value_bound(self) -> float:
        return self.bound


@dataclass(frozen=True)
class CVAP(Consistency):
    """Clock- and value-bounded: both SSP(``staleness``) and VAP(``bound``)."""

    staleness: int = 2
    bound: float = 1.0
    name = "cvap"

    def __post_init__(self):
        _check_staleness(self.staleness)
        _check_bound(self.bound)

    @property
    def value_bound(self) -> float:
        return self.bound


@dataclass(frozen=True)
class ASP(Consistency):
    """Fully asynchronous: read-my-writes only, never waits."""

    name = "asp"


def _check_staleness(s):
    if not isinstance(s, int) or isinstance(s, bool) or s < 0:
        raise ValueError(f"staleness must be a non-negative int, got {s!r}")


def _check_refresh(r):
    if not isinstance(r, bool):
        raise ValueError(f"refresh must be True or False, got {r!r}")


def _check_bound(v):
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
        raise ValueError(f"bound must be a positive number, got {v!r}")


MODELS: dict[str, type[Consistency]] = {
    c.name: c for c in (BSP, SSP, ESSP, VAP, CVAP, ASP)
}


def default_consistency() -> Consistency:
    """The model a table gets when ``consistency=None``: ``dask.config`` key
    ``ps.consistency`` (a model name) with ``ps.staleness`` for clocked models
    and ``ps.refresh`` (default False) for SSP and ESSP."""
    name = str(dask.config.get("ps.consistency")).lower()
    if name not in MODELS:
        raise ValueError(f"ps.consistency must be one of {sorted(MODELS)}, got {name!r}")
    cls = MODELS[name]
    if name in ("ssp", "essp"):
        refresh = dask.config.get("ps.refresh", False)
        if isinstance(refresh, str):
            refresh = refresh.strip().lower() in ("1", "true", "yes", "on")
        return cls(staleness=int(dask.config.get("ps.staleness")), refresh=bool(refresh))
    if name == "cvap":
        return cls(staleness=int(dask.config.get("ps.staleness")))
    return cls()


def as_consistency(c) -> Consistency:
    """Accept a model object, a name ("ssp"), or None (the configured default)."""
    if c is None:
        return default_consistency()
    if isinstance(c, Consistency):
        return c
    if isinstance(c, str) and c.lower() in MODELS:
        return MODELS[c.lower()]()
    raise TypeError(
        f"consistency must be one of {[m.__name__ for m in MODELS.values()]} "
        f"(e.g. dask_ps.SSP(staleness=2)), a model name, or None; got {c!r}"
    )
