"""Fixtures of the LDA tests."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture(scope="module")
def lda_client():
    from distributed import Client, LocalCluster

    logging.getLogger("distributed").setLevel(logging.WARNING)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with Client(cluster, set_as_default=False) as client:
            yield client
