"""Issue 22: the checkpoint handlers.

A worker's ``ps_load_blocks`` called by a client loaded a file into one
replica only (the copies then differed; a NaN landed in an
``allow_nonfinite=False`` table), and ``ps_save_blocks`` wrote to any path.
Now both are internal: the scheduler drives them for ``ps.save`` and
``ps.load``, computes the directories under the path the client named, has
every block checked against the table's spec before any copy takes it, and
installs it on every copy or on none."""

from __future__ import annotations

import glob
import io
import os

import numpy as np
import pytest

import dask_ps
from dask_ps import _checkpoint


def _copies(name, dask_worker=None):
    t = dask_worker.extensions["ps"].store.tables.get(name)
    return {} if t is None else {b: blk.data.copy() for b, blk in t.blocks.items()}


def _loads_staged(dask_worker=None):
    return len(dask_worker.extensions["ps"]._loads)


def _block_file(path, table, block):
    manifest = _checkpoint.read_manifest(path)
    return _checkpoint.block_path(_checkpoint.table_dir(path, manifest["tables"][table]["data"], table), block)


def _rewrite(file, **change):
    with open(file, "rb") as f:
        z = dict(np.load(io.BytesIO(f.read())))
    z.update(change)
    buf = io.BytesIO()
    np.savez(buf, **z)
    with open(file, "wb") as f:
        f.write(buf.getvalue())


def test_a_client_can_neither_load_into_a_copy_nor_save_anywhere(ps, client, tmp_path):
    """Called by a client, the workers' checkpoint handlers are refused
    (``InternalOnlyError``): nothing is loaded into any copy and nothing is
    written to the directory the client named."""
    ps.create_table("c", shape=(8,), block_rows=4, init=np.arange(8.0), replication=2, allow_nonfinite=False)
    path = str(tmp_path / "ckpt")
    ps.save(path)
    _rewrite(_block_file(path, "c", 0), data=np.full(4, np.nan))
    h = ps._handle("c")
    elsewhere = tmp_path / "elsewhere"
    for addr in h.owners[0]:
        with pytest.raises(PermissionError, match="ps_load_blocks"):
            client.sync(client.rpc(addr).ps_load_blocks, table="c", table_id=h.spec.table_id, blocks=[0],
                        directory=os.path.dirname(_block_file(path, "c", 0)), load_id="x")
        with pytest.raises(PermissionError, match="ps_install_loaded"):
            client.sync(client.rpc(addr).ps_install_loaded, table="c", table_id=h.spec.table_id, load_id="x")
        with pytest.raises(PermissionError, match="ps_save_blocks"):
            client.sync(client.rpc(addr).ps_save_blocks, table="c", table_id=h.spec.table_id,
                        directory=str(elsewhere))
    assert not elsewhere.exists()
    for copies in client.run(_copies, "c").values():
        for b, data in copies.items():
            np.testing.assert_array_equal(data, np.arange(8.0)[4 * b:4 * b + 4])


@pytest.mark.parametrize("damage", ["nan", "shape", "dtype", "state"])
def test_load_checks_every_block_and_fills_every_copy_or_none(ps, client, tmp_path, damage):
    """A checkpoint block with a NaN (the table forbids them), the wrong
    shape or dtype, or rule state the rule does not keep: ``ps.load``
    raises ``PSValueError`` naming the table and the block, and no copy
    took anything (the table it created is dropped again). The intact
    checkpoint then loads into every copy alike."""
    ps.create_table("c", shape=(8,), block_rows=4, init=np.arange(8.0), replication=2, allow_nonfinite=False)
    path = str(tmp_path / "ckpt")
    ps.save(path)
    file = _block_file(path, "c", 1)
    with open(file, "rb") as f:
        intact = f.read()
    change = {"nan": dict(data=np.array([4.0, np.nan, 6.0, 7.0])), "shape": dict(data=np.zeros(5)),
              "dtype": dict(data=np.zeros(4, dtype=np.float32)), "state": dict(state__velocity=np.zeros(4))}[damage]
    _rewrite(file, **change)
    with pytest.raises(dask_ps.PSValueError, match=r"'c'.*block 1") as err:
        ps.load(path, overwrite=True)
    assert {"nan": "NaN", "shape": "(5,)", "dtype": "float32", "state": "velocity"}[damage] in str(err.value)
    assert "c" not in ps.tables()
    assert all(not copies for copies in client.run(_copies, "c").values())
    assert set(client.run(_loads_staged).values()) == {0}  # nothing left aside
    with open(file, "wb") as f:
        f.write(intact)
    ps.load(path)
    np.testing.assert_array_equal(ps.pull("c"), np.arange(8.0))
    held = client.run(_copies, "c")
    for b in range(2):
        copies = [c[b] for c in held.values() if b in c]
        assert len(copies) == 2
        for data in copies:
            np.testing.assert_array_equal(data, np.arange(8.0)[4 * b:4 * b + 4])


def test_save_writes_only_under_the_path_it_was_given(ps, client, tmp_path):
    """The scheduler computes every directory a save writes: a table name
    that would leave ``path/<data dir>`` is refused before anything is
    written, and a checkpoint the scheduler did not save is never noted
    (a lost block is restored only from a save it drove)."""
    inside = tmp_path / "inside"
    inside.mkdir()
    with pytest.raises(dask_ps.PSValueError, match="not allowed"):  # refused at create_table now (issue 34)
        ps.create_table("../../escape", shape=(4,))
    with pytest.raises(dask_ps.PSValueError):
        ps.save(str(inside / "ckpt"), tables="../../escape")
    assert glob.glob(str(tmp_path / "**" / "block-*.npz"), recursive=True) == []

    ps.create_table("w", shape=(4,), init=1.0)
    path = str(tmp_path / "ckpt")
    ps.save(path)
    data = _checkpoint.read_manifest(path)["tables"]["w"]["data"]
    checkpoint = lambda: client.run_on_scheduler(  # noqa: E731
        lambda dask_scheduler: dask_scheduler.extensions["ps"].tables["w"].checkpoint)
    assert checkpoint() == (path, data)
    for forged in (dict(path=str(tmp_path / "forged"), data=data),
                   dict(path=path, data=_checkpoint.new_data_dir(path))):
        with pytest.raises(dask_ps.PSValueError, match="'w'.*no ps.save"):
            client.sync(ps._scheduler.ps_note_checkpoint, tables=["w"], **forged)
    assert checkpoint() == (path, data)
    for bad in ("../x", "ckpt-evil"):
        with pytest.raises(dask_ps.PSValueError):
            client.sync(ps._scheduler.ps_save_tables, path=path, data=bad, tables=["w"])


def test_a_failed_load_leaves_the_tables_after_it_and_damage_is_named(ps, client, tmp_path):
    """``load(overwrite=True)`` dropped every table it would replace before
    reading any block: a truncated block of the first table lost the
    second too, which was intact. A truncated block said only "File is not
    a zip file", a damaged manifest a bare JSONDecodeError."""
    import json

    ps.create_table("a", shape=(8,), block_rows=4, init=np.arange(8.0))
    ps.create_table("b", shape=(8,), block_rows=4, init=np.arange(8.0) * 2)
    path = str(tmp_path / "ckpt")
    ps.save(path)
    ps.push("b", np.ones(8))
    with open(_block_file(path, "a", 1), "r+b") as f:
        f.truncate(50)
    with pytest.raises(dask_ps.PSValueError, match=r"table 'a': block 1 of the checkpoint.*BadZipFile"):
        ps.load(path, overwrite=True)
    assert "a" not in ps.tables()
    np.testing.assert_array_equal(ps.pull("b"), np.arange(8.0) * 2 + 1)  # not dropped, not loaded
    manifest = os.path.join(path, "manifest.json")
    with open(manifest) as f:
        text = f.read()
    json.loads(text)
    with open(manifest, "w") as f:
        f.write(text[: len(text) // 2])
    with pytest.raises(ValueError, match="manifest.json is damaged"):
        ps.load(path, overwrite=True)
    with pytest.raises(ValueError, match="manifest.json is damaged"):
        dask_ps.checkpoint_metadata(path)


@pytest.mark.parametrize("value, ok", [(3, True), (np.zeros(2), True), ({"count": 1}, False), ([1.0], False),
                                       ("seen", False)])
def test_a_rules_state_that_a_checkpoint_cannot_hold_is_refused_when_saved(tmp_path, value, ok):
    """A custom rule's non-array state: an int failed the save with
    ``'int' object has no attribute 'copy'``, a dict saved but never loaded
    again (object arrays), a list came back an array its rule could not
    ``append`` to. Numbers and arrays save; the rest is refused at the save,
    naming the state."""
    from dask_ps import _checkpoint

    exported = {"block": 0, "data": np.zeros(4), "seq": 1, "state": {"k": value}}
    if ok:
        _checkpoint.write_block(str(tmp_path), exported)
        back = _checkpoint.read_block(str(tmp_path), 0)
        np.testing.assert_array_equal(back["state"]["k"], value)
    else:
        with pytest.raises(ValueError, match=r"state\['k'\] is a (dict|list|str).*numeric arrays only"):
            _checkpoint.write_block(str(tmp_path), exported)
