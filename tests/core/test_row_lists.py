"""Row lists named by a key (issue 36, ``dask_ps._row_lists``): a
participant sends a block's row list once to a server, then its key only;
a server that does not hold a key refuses the whole message and the
participant sends it again in full. Pure: no cluster (the transport's
resend runs against a fake server on an event loop)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import dask
from dask_ps._exceptions import PSValueError, RowListMissingError, StaleVersionError
from dask_ps._row_lists import MIN_ROWS, RowListCache, RowListKeys

A, B = "tcp://a:1", "tcp://b:1"


def rows(n=1000, seed=0, high=100_000):
    return np.sort(np.random.default_rng(seed).choice(high, n, replace=False)).astype(np.int32)


# --- the participant's side ------------------------------------------------------------
def key(keys, table_id, block, r):
    """The key of a list sent a second time (the first goes in full)."""
    assert keys.key_of(table_id, block, r) is None
    return keys.key_of(table_id, block, r)


def test_a_list_is_keyed_the_second_time_it_is_sent():
    """Lists that never repeat cost no copy: only their fingerprints are kept."""
    keys = RowListKeys(1 << 20)
    assert [keys.key_of("t", 0, rows(seed=s)) for s in range(10)] == [None] * 10
    assert keys.nbytes == 0
    assert keys.key_of("t", 0, rows(seed=3)) is not None and keys.nbytes == rows().nbytes


def test_the_same_list_gets_its_key_again_by_content_not_by_object():
    keys = RowListKeys(1 << 20)
    r = rows()
    k = key(keys, "t1", 0, r)
    assert k is not None
    assert keys.key_of("t1", 0, r.copy()) == k  # another array, the same rows
    assert key(keys, "t1", 1, r) != k  # another block: another list
    assert key(keys, "t2", 0, r) != k  # another table
    other = r.copy()
    other[len(r) // 3] += 1  # differs where the fingerprint does not look
    assert not np.array_equal(other, r)
    k2 = keys.key_of("t1", 0, other)  # its fingerprint is known: keyed at once, with its own key
    assert k2 not in (None, k)  # compared exactly: never another list's key


def test_a_key_is_held_by_a_server_only_once_it_acknowledged_it():
    keys = RowListKeys(1 << 20)
    k = key(keys, "t", 0, rows())
    assert not keys.held_at(k, A)
    keys.acknowledged(A, [k])
    assert keys.held_at(k, A) and not keys.held_at(k, B)
    keys.forget_server(A)  # it refused a key: every list goes in full again
    assert not keys.held_at(k, A)


def test_short_lists_ranges_and_lists_larger_than_the_cache_go_in_full():
    keys = RowListKeys(1000)
    for _ in range(2):
        assert keys.key_of("t", 0, rows(MIN_ROWS - 1)) is None
        assert keys.key_of("t", 0, [3, 9]) is None  # a range [start, stop]
        assert keys.key_of("t", 0, rows(300)) is None  # 1200 bytes > 1000
    assert key(keys, "t", 0, rows(200)) is not None


def test_the_participants_lists_are_bounded_least_recently_used_first():
    keys = RowListKeys(3 * 1000 * 4)  # three lists of 1000 int32 rows
    lists = [rows(seed=s) for s in range(4)]
    k = [key(keys, "t", 0, r) for r in lists[:3]]
    keys.acknowledged(A, k)
    assert keys.key_of("t", 0, lists[0]) == k[0]  # used again: the most recent
    key(keys, "t", 0, lists[3])  # drops lists[1], the least recently used
    assert keys.nbytes <= keys.max_bytes
    assert not keys.held_at(k[1], A) and keys.held_at(k[0], A) and keys.held_at(k[2], A)
    assert key(keys, "t", 0, lists[1]) not in k  # a new key: the server may have dropped the old one too


def test_keys_are_unique_to_a_participant_a_retried_one_gets_new_ones():
    r = rows()
    assert key(RowListKeys(1 << 20), "t", 0, r) != key(RowListKeys(1 << 20), "t", 0, r)


# --- the server's side ------------------------------------------------------------------
def cache(max_bytes=1 << 20):
    return RowListCache(lambda: max_bytes)


def test_a_list_sent_with_its_key_is_named_by_it_later():
    c, r = cache(), rows()
    got = c.resolve("t", [0, 1], [{"key": "p.0", "rows": r}, None], run_id="run")
    np.testing.assert_array_equal(got[0], r)
    assert got[1] is None
    later = c.resolve("t", [0], [{"key": "p.0"}], run_id="run")
    np.testing.assert_array_equal(later[0], r)
    assert not later[0].flags.writeable  # kept: nothing writes into it
    assert c.stats["hits"] == 1 and c.stats["stored"] == 1
    plain = [np.arange(3), [0, 5]]
    assert c.resolve("t", [0, 1], plain) is plain  # nothing keyed: as it came


def test_a_key_not_held_refuses_the_message_and_keeps_nothing_of_it():
    c = cache()
    with pytest.raises(RowListMissingError) as e:
        c.resolve("t", [0, 1], [{"key": "p.1", "rows": rows()}, {"key": "p.0"}])
    assert e.value.keys == ["p.0"] and isinstance(e.value, StaleVersionError)  # retryable
    assert len(c) == 0  # the message comes again in full
    c.resolve("t", [0], [{"key": "p.0", "rows": rows()}])
    for blocks, table in (([1], "t"), ([0], "other")):  # a key names one block of one table
        with pytest.raises(RowListMissingError):
            c.resolve(table, blocks, [{"key": "p.0"}])


def test_the_servers_lists_are_bounded_and_go_with_their_run_and_table():
    r = rows()
    c = cache(2 * r.nbytes)
    for i in range(3):
        c.resolve("t", [0], [{"key": f"p.{i}", "rows": r}], run_id="run-a")
    assert len(c) == 2 and c.nbytes == 2 * r.nbytes and c.stats["evicted"] == 1
    with pytest.raises(RowListMissingError):
        c.resolve("t", [0], [{"key": "p.0"}])  # evicted: the sender sends it again
    c.resolve("u", [0], [{"key": "q.0", "rows": r}], run_id="run-b")
    c.forget_run("run-a")
    assert len(c) == 1 and c.nbytes == r.nbytes
    c.forget_table("u")
    assert len(c) == 0 and c.nbytes == 0


@pytest.mark.parametrize("bad", [{"key": 3}, {"key": "k", "rows": np.ones(3)}, {"key": "k", "x": 1},
                                 {"key": "k", "rows": np.zeros((2, 2), np.int64)}])
def test_a_malformed_keyed_list_is_refused(bad):
    with pytest.raises(PSValueError):
        cache().resolve("t", [0], [bad])


# --- the transport: resent in full where a server lost a key -----------------------------
class FakeServer:
    """``ps_pull``/``ps_push`` of one worker: its row list cache, and the
    rows every message it applied named (after resolving keys)."""

    def __init__(self):
        self.lists = cache()
        self.seen = []
        self.messages = 0

    def __call__(self, addr):
        return self

    async def ps_pull(self, **msg):
        self.messages += 1
        # as the comm delivers it: arrays, not their wrappers
        wire = [{k: _unwrapped(x) for k, x in r.items()} if isinstance(r, dict) else _unwrapped(r)
                for r in msg["rows"]]
        got = self.lists.resolve(msg["table_id"], msg["blocks"], wire, None)
        self.seen.append(got)
        return {"seqs": [0] * len(got), "values": [np.zeros(len(r)) for r in got]}


def _unwrapped(r):
    from dask_ps._wire import unwrap

    return unwrap(getattr(r, "data", r))  # to_serialize's wrapper or inline bytes: the array


class FakeLocal:
    internal_token = "tok"
    worker = None


def test_a_server_that_lost_its_keys_gets_every_list_again_and_reads_the_right_rows():
    from dask_ps._routing import TableHandle
    from dask_ps._spec import TableSpec
    from dask_ps._transport import Transport

    server = FakeServer()
    spec = TableSpec.create("t", (200_000,), "float64", block_rows=100_000)
    h = TableHandle(spec, 1, ((A,), (A,)))
    with dask.config.set({"ps.row-lists.keyed": True}):
        tr = Transport(server, None, local=FakeLocal())

    def lists(seed):
        r = rows(2000, seed, 200_000)
        return [(0, r[r < 100_000]), (1, (r[r >= 100_000] - 100_000).astype(np.int32))]

    order = [0, 1, 0, 1, 0, 1, 0, 1]

    async def main():
        for i in order[:6]:  # in full, then with their keys, then by their keys
            await tr.pull(A, h, lists(i))
        server.lists = cache()  # the server restarted: it holds no key
        for i in order[6:]:
            await tr.pull(A, h, lists(i))

    asyncio.run(main())
    # every read was made with its own rows, whatever went on the wire
    assert len(server.seen) == len(order)  # the refused message read nothing
    for i, seen in zip(order, server.seen):
        for (b, r), s in zip(lists(i), seen):
            np.testing.assert_array_equal(s, r)
    assert server.messages == 9  # eight reads, one sent again after the restart
    assert tr.sent["row_lists_refused"] == 1
    # by key only: reads 5-6 and the refused one; sent again, and read 8, with the lists
    assert tr.sent["row_lists_keyed"] == 2 * 2 + 2
    assert tr.sent["pull"] == 9
