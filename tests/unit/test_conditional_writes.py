"""The one rule of a conditional write on every store (objectstore.ObjectStore): a failed
condition is a lost race only when the object holds other bytes; a write under way elsewhere is
tried again. Each store's own put is tested on the real store (tests/objectstore)."""

from __future__ import annotations

import pytest

from hybridflow.data.objectstore import Busy, Conflict, ObjectStore
from hybridflow.data.storage import object_path

PATH = object_path("s3://lake/p/LEASE")


class Store(ObjectStore):
    """Objects in a dict; `lose` answers to drop (the write is made, its answer lost, and the client
    sends it again), `busy` puts to answer as S3 does while another conditional write is under way."""

    def __init__(self, lose: int = 0, busy: int = 0) -> None:
        self.objects: dict[str, tuple[bytes, str]] = {}
        self.lose, self.busy, self.puts = lose, busy, 0

    def _put(self, path, body, create_only, if_match):
        self.puts += 1
        if self.busy:
            self.busy -= 1
            raise Busy(path.uri)
        held = self.objects.get(str(path))
        if (create_only and held) or (if_match and (held is None or held[1] != if_match)):
            raise Conflict(path.uri)
        self.objects[str(path)] = (body, f"tag{self.puts}")
        if self.lose:  # the retry of a write whose answer was lost meets the write itself
            self.lose -= 1
            return self._put(path, body, create_only, f"tag-before-{self.puts}" if if_match else None)
        return f"tag{self.puts}"

    def _read_bytes(self, path):
        return self.objects.get(str(path), (None, None))


def test_a_retried_create_or_swap_that_meets_its_own_write_is_ours():
    store = Store(lose=2)
    made = store.write_json(PATH, {"holder": "run-1"}, create_only=True)
    assert store.read_json(PATH) == ({"holder": "run-1"}, made)
    swapped = store.write_json(PATH, {"holder": "run-1", "n": 2}, if_match=made)
    assert store.read_json(PATH) == ({"holder": "run-1", "n": 2}, swapped) and store.puts == 4


def test_a_failed_condition_over_other_bytes_is_a_lost_race():
    store = Store()
    made = store.write_json(PATH, {"holder": "run-1"}, create_only=True)
    with pytest.raises(Conflict):
        store.write_json(PATH, {"holder": "run-2"}, create_only=True)
    with pytest.raises(Conflict):
        store.write_json(PATH, {"holder": "run-2"}, if_match="an old tag")
    assert store.read_json(PATH) == ({"holder": "run-1"}, made)


def test_a_write_that_met_another_under_way_is_tried_again_then_lost():
    store = Store(busy=2)
    made = store.write_json(PATH, {"holder": "run-1"}, create_only=True)
    assert store.puts == 3 and store.read_json(PATH) == ({"holder": "run-1"}, made)
    store = Store(busy=5)
    with pytest.raises(Conflict) as raised:
        store.write_json(PATH, {"holder": "run-1"}, create_only=True)
    assert store.puts == 3 and not isinstance(raised.value, Busy)
