"""Issue 34, item 6: ``create_table`` accepted names such as ``'../x'``
(only a later ``ps.save`` refused them). A name is also a checkpoint
directory name, so it is checked when the table is created, from the
client's arguments and from a raw message alike."""

from __future__ import annotations

import pytest

from dask_ps import PSValueError
from dask_ps._spec import TableSpec


@pytest.mark.parametrize("name", ["../x", "..", ".", "a/b", "/abs", "a\\b", "tab\tle", "nul\x00", "x" * 201])
def test_a_name_that_is_no_directory_name_is_refused(name):
    with pytest.raises(PSValueError, match="not allowed"):
        TableSpec.create(name, (4,))
    msg = TableSpec.create("ok", (4,)).to_msg()
    with pytest.raises(PSValueError, match="not allowed"):
        TableSpec.from_msg({**msg, "name": name})


@pytest.mark.parametrize("name", ["w", "lda-3f2a-nwk", "model.v2", "a:b", "x" * 200, "über"])
def test_ordinary_names_are_taken(name):
    assert TableSpec.from_msg(TableSpec.create(name, (4,)).to_msg()).name == name
