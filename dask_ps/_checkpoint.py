"""Checkpoint files (pure I/O, through fsspec so any filesystem Dask can reach works).

Layout of a checkpoint directory ``path``::

    path/manifest.json            the commit point: per table its spec and data directory; metadata
    path/ckpt-<id>/<table>/block-<b>.npz   values and rule state of one row block

A save writes a new ``ckpt-<id>`` directory (each worker writes the blocks it
is primary of, so data never passes through the client or the scheduler),
then replaces ``manifest.json`` by renaming a temporary file over it, and
finally deletes the ``ckpt-*`` directories no table refers to any more. Saving
some tables keeps the other tables' entries. A reader only follows the
manifest, so it sees the old checkpoint or the new one, never a mix.
"""

from __future__ import annotations

import base64
import io
import json
import posixpath
import re
import time
import uuid

import fsspec
import numpy as np

FORMAT = 1


def _fs(path: str):
    fs, root = fsspec.core.url_to_fs(path)
    return fs, root.rstrip("/")


def block_path(directory: str, block: int) -> str:
    return posixpath.join(directory, f"block-{block:06d}.npz")


def write_block(directory: str, exported: dict) -> None:
    """Write one exported block (``ShardStore.export``) as an ``.npz``."""
    from dask_ps._backend import to_numpy

    fs, d = _fs(directory)
    fs.makedirs(d, exist_ok=True)
    arrays = {"data": to_numpy(exported["data"]), "seq": np.array(exported["seq"])}
    for k, v in exported["state"].items():
        kept = v  # a list would come back as an array, a str or dict not at all (np.load refuses objects)
        v = to_numpy(v) if hasattr(v, "shape") else np.asarray(v)
        if v.dtype.kind not in "biufc" or not (hasattr(kept, "shape") or isinstance(kept, (int, float, complex))):
            raise ValueError(f"block {exported['block']}: the rule's state[{k!r}] is a {type(exported['state'][k]).__name__}"
                             f" ({v.dtype}); a checkpoint holds a rule's state as numeric arrays only")
        arrays[f"state__{k}"] = v
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    with fs.open(block_path(d, exported["block"]), "wb") as f:
        f.write(buf.getvalue())


def read_block(directory: str, block: int) -> dict:
    fs, d = _fs(directory)
    with fs.open(block_path(d, block), "rb") as f:
        z = np.load(io.BytesIO(f.read()), allow_pickle=False)
        return {
            "block": block,
            "data": z["data"],
            "seq": int(z["seq"]),
            "state": {k[len("state__"):]: z[k] for k in z.files if k.startswith("state__")},
            "applied": {},
        }


def new_data_dir(path: str) -> str:
    return f"ckpt-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"


def _encode(obj):
    """JSON for specs: bytes (a custom rule's pickle) as base64."""
    if isinstance(obj, bytes):
        return {"__bytes__": base64.b64encode(obj).decode()}
    if isinstance(obj, dict):
        return {k: _encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_encode(v) for v in obj]
    return obj


def _decode(obj):
    if isinstance(obj, dict):
        if set(obj) == {"__bytes__"}:
            return base64.b64decode(obj["__bytes__"])
        return {k: _decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(v) for v in obj]
    return obj


def commit(path: str, tables: dict, metadata: dict) -> dict:
    """Atomically make the checkpoint at ``path`` hold ``tables`` (name ->
    {"spec", "data"}) on top of the tables already saved there, then remove
    data directories no table refers to. Returns the manifest."""
    fs, root = _fs(path)
    old = read_manifest(path) or {"tables": {}}
    manifest = {"format": FORMAT, "created": time.time(), "tables": {**old["tables"], **tables},
                "metadata": metadata}
    tmp = posixpath.join(root, f".manifest-{uuid.uuid4().hex}.json")
    with fs.open(tmp, "w") as f:
        json.dump(_encode(manifest), f)
    fs.mv(tmp, posixpath.join(root, "manifest.json"))
    used = {e["data"] for e in manifest["tables"].values()}
    for entry in fs.ls(root, detail=False):
        name = posixpath.basename(entry.rstrip("/"))
        if name.startswith("ckpt-") and name not in used:
            fs.rm(entry, recursive=True)
    return manifest


def read_manifest(path: str) -> dict | None:
    fs, root = _fs(path)
    p = posixpath.join(root, "manifest.json")
    if not fs.exists(p):
        return None
    with fs.open(p, "r") as f:
        try:
            manifest = _decode(json.load(f))
        except json.JSONDecodeError as err:  # a damaged manifest: say which file, not a bare JSONDecodeError
            raise ValueError(f"the checkpoint manifest {p} is damaged ({err}); restore it or delete the "
                             "checkpoint directory to save there again") from None
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: unknown checkpoint format {manifest.get('format')!r}")
    return manifest


def checkpoint_metadata(path) -> dict | None:
    """The ``metadata`` stored by :meth:`ParameterServer.save` at ``path``
    (None if there is no checkpoint there), without loading any table.

    Estimators use it to decide whether a checkpoint belongs to the fit
    they are asked to resume.
    """
    manifest = read_manifest(str(path))
    return None if manifest is None else dict(manifest.get("metadata") or {})


# new_data_dir's names: the only data directories a save writes or a load reads
_DATA_DIR = re.compile(r"ckpt-[0-9]{8}T[0-9]{6}-[0-9a-f]{8}")


def resolve(path: str) -> str:
    """``path`` as the URL every process reads the same way: a local path
    made absolute here (the client's working directory, not a worker's)."""
    _, root = _fs(path)
    proto = fsspec.core.split_protocol(path)[0]
    return f"{proto}://{root}" if proto else root


def table_dir(path: str, data: str, table: str) -> str:
    """Where table ``table``'s blocks of the data directory ``data`` of the
    checkpoint at ``path`` are: always under ``path/data``. A data directory
    not named as :func:`new_data_dir` names them, or a table name that would
    leave it (``..``, an absolute name), raises ``ValueError``."""
    if not isinstance(data, str) or not _DATA_DIR.fullmatch(data):
        raise ValueError(f"{data!r} is not a checkpoint data directory (ckpt-<time>-<id>)")
    if not isinstance(table, str) or not table:
        raise ValueError(f"a table name must be a non-empty str, got {table!r}")
    _, root = _fs(path)
    proto = fsspec.core.split_protocol(path)[0]
    base = posixpath.normpath(posixpath.join(root, data))
    joined = posixpath.normpath(posixpath.join(base, table))
    if not joined.startswith(base + "/") or table.startswith("/"):
        raise ValueError(f"table name {table!r} would leave the checkpoint's directory {base}")
    return f"{proto}://{joined}" if proto else joined


def refuse_overwrite(name: str, active_runs: list) -> None:
    """``ps.load(overwrite=True)`` of a table that active runs use would
    replace what they pushed (and fail them with ``StaleVersionError``):
    refused, naming the table and the runs, as ``ps.save`` refuses during
    a run (issue 34)."""
    if active_runs:
        raise RuntimeError(
            f"ps.load: table {name!r} is in use by active run(s) {list(active_runs)}; overwriting it would "
            "replace what they pushed. Load it after they end"
        )


def read_checked_block(spec, directory: str, block: int) -> dict:
    """One block of a checkpoint, read and checked against ``spec`` (a
    worker's ``load_blocks``, off the event loop)."""
    from dask_ps._exceptions import PSValueError
    from dask_ps._shard import ShardStore

    import zipfile

    try:
        e = read_block(directory, int(block))
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as err:  # BadZipFile: a truncated file
        raise PSValueError(f"table {spec.name!r}: block {block} of the checkpoint at {directory} could not "
                           f"be read: {err!r}", spec.name) from None
    return ShardStore.check_loaded(spec, e)
