"""The collector settings a server process takes once start-up is done (slotkeeper/collector.py)."""

import gc

import pytest

from slotkeeper import collector


@pytest.fixture
def restored():
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_tuning_freezes_what_start_up_built_and_collects_the_young_generation_less_often(restored):
    built_at_start_up = [object() for _ in range(10)]  # a container the collector tracks
    collector.tune(12_345)
    assert gc.get_threshold() == (12_345, *collector.GENERATIONS)
    assert gc.get_freeze_count() > 0
    # Frozen: in no generation the collector walks any more.
    assert all(o is not built_at_start_up for o in gc.get_objects())


def test_a_zero_threshold_leaves_the_collector_as_cpython_sets_it(restored):
    before = gc.get_threshold()
    collector.tune(0)
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_cyclic_garbage_made_after_start_up_is_still_collected(restored):
    collector.tune(10_000)

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a
    del a, b
    assert gc.collect() >= 2
