"""Register dask_ps defaults under the ``ps`` namespace of ``dask.config``."""

from __future__ import annotations

import functools
import os

import dask.config
import yaml
from dask.utils import parse_bytes, parse_timedelta

_fn = os.path.join(os.path.dirname(__file__), "ps.yaml")
with open(_fn) as f:
    _defaults = yaml.safe_load(f)

dask.config.update_defaults(_defaults)


@functools.lru_cache(maxsize=256)
def _parse_bytes(value) -> int:
    return parse_bytes(value)


@functools.lru_cache(maxsize=256)
def _parse_seconds(value) -> float:
    return parse_timedelta(value, default="s")


def get_bytes(key: str) -> int:
    """``dask.config`` value ``ps.<key>`` as a number of bytes (read on every
    call, so ``dask.config.set`` applies at once; parsing is memoized)."""
    return _parse_bytes(dask.config.get(f"ps.{key}"))


def get_seconds(key: str) -> float:
    """``dask.config`` value ``ps.<key>`` as seconds."""
    return _parse_seconds(dask.config.get(f"ps.{key}"))


def get(key: str):
    return dask.config.get(f"ps.{key}")
