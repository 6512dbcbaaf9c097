"""Register dask_ps defaults under the ``ps`` namespace of ``dask.config``."""

from __future__ import annotations

import os

import dask.config
import yaml
from dask.utils import parse_bytes, parse_timedelta

_fn = os.path.join(os.path.dirname(__file__), "ps.yaml")
with open(_fn) as f:
    _defaults = yaml.safe_load(f)

dask.config.update_defaults(_defaults)


def get_bytes(key: str) -> int:
    """``dask.config`` value ``ps.<key>`` as a number of bytes."""
    return parse_bytes(dask.config.get(f"ps.{key}"))


def get_seconds(key: str) -> float:
    """``dask.config`` value ``ps.<key>`` as seconds."""
    return parse_timedelta(dask.config.get(f"ps.{key}"), default="s")


def get(key: str):
    return dask.config.get(f"ps.{key}")
