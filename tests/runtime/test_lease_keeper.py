"""`LeaseKeeper` and the renewal schedule when the store's answers are lost or refused."""

from __future__ import annotations

import asyncio
import logging

import pytest

from procstore import NotLeader, StoreError
from procstore._runtime.lease import LEASE_KEY, Lease, LeaseKeeper, LeaseRecord
from procstore.store import open_state_store
from procstore.testing import Fault, FaultyStore, run_simulated
from tests.support import StoreTarget, manager_for

TTL = 1.0


def lost_answer() -> Fault:
    """The lease write lands, and its answer is lost (a reset after the request was served)."""
    return Fault("transient", kinds=frozenset({"put_if_version"}), when="after", times=1)


def keeper_on(store: FaultyStore, holder: str = "cp-1") -> LeaseKeeper:
    return LeaseKeeper(store, LEASE_KEY, Lease(ttl=TTL, holder=holder))


async def stored(store: FaultyStore) -> LeaseRecord:
    found = await store.inner.get_versioned(LEASE_KEY)
    assert found is not None
    return LeaseRecord.decode(found[0])


def test_a_renewal_whose_answer_was_lost_is_recognised_and_counted_from_its_first_send(
    memory_target: StoreTarget,
) -> None:
    # In the loop's virtual time (the lease's clock there): exact, whatever the machine's load.
    async def body() -> None:
        store = FaultyStore(open_state_store(memory_target.url))
        keeper = keeper_on(store)
        assert await keeper.acquire_once()
        store.plan.faults.append(lost_answer())
        loop = asyncio.get_running_loop()
        first_sent = loop.time()
        with pytest.raises(StoreError):
            await keeper.renew_once()
        assert (await stored(store)).renewal == 1
        await asyncio.sleep(0.2)
        # The retry's swap is refused (the version moved), and the record read back is ours.
        assert await keeper.renew_once()
        assert keeper.record is not None and keeper.record.renewal == 1
        # A standby may have seen that record as soon as the first attempt landed: the lease
        # runs from then (not from the retry, 0.2 s later).
        from_first_send = first_sent + TTL - keeper.lease.stop_margin - loop.time()
        assert keeper.seconds_left == pytest.approx(from_first_send, abs=1e-9)

    run_simulated(body())


async def test_a_renewal_recognised_only_after_its_lease_ran_out_does_not_count(memory_target: StoreTarget) -> None:
    store = FaultyStore(open_state_store(memory_target.url))
    keeper = keeper_on(store)
    assert await keeper.acquire_once()
    store.plan.faults.append(lost_answer())
    with pytest.raises(StoreError):
        await keeper.renew_once()
    await asyncio.sleep(0.5)
    # The retry's read-back comes after the first attempt's lease (0.8 s) is over.
    store.plan.faults.append(Fault("delay", kinds=frozenset({"get_versioned"}), seconds=0.4, times=1))
    assert not await keeper.renew_once()
    assert not keeper.is_holding and keeper.leader is None


async def test_release_after_a_lost_answer_still_marks_the_lease_released(memory_target: StoreTarget) -> None:
    store = FaultyStore(open_state_store(memory_target.url))
    keeper = keeper_on(store)
    assert await keeper.acquire_once()
    store.plan.faults.append(lost_answer())
    with pytest.raises(StoreError):
        await keeper.renew_once()
    await keeper.release()
    record = await stored(store)
    assert record.released and record.holder == "cp-1" and record.epoch == 1
    assert not keeper.is_holding


async def test_release_leaves_a_lease_another_manager_took(memory_target: StoreTarget) -> None:
    store = FaultyStore(open_state_store(memory_target.url))
    first, second = keeper_on(store, "cp-1"), keeper_on(store, "cp-2")
    assert await first.acquire_once()
    taken = LeaseRecord("cp-2", 2, 0, TTL)
    assert await store.inner.put_if_version(LEASE_KEY, taken.encode(), first._version)
    await first.release()
    assert await stored(store) == taken
    assert not await second.acquire_once()


async def test_a_leader_keeps_its_lease_through_several_failed_renewals_in_a_row(
    memory_target: StoreTarget, caplog: pytest.LogCaptureFixture
) -> None:
    """A failed attempt is tried again at once, not a renewal interval later."""
    store = FaultyStore(open_state_store(memory_target.url))
    manager = manager_for(store, lease=Lease(ttl=TTL, holder="cp-1"))
    await manager.start()
    try:
        store.plan.faults.append(Fault("transient", kinds=frozenset({"put_if_version"}), times=3))
        with caplog.at_level(logging.WARNING, logger="procstore.lease"):
            await asyncio.sleep(TTL * 1.5)
        assert caplog.text.count("lease renewal failed (") == 3
        assert "stops leading" not in caplog.text
        assert manager.is_leader
    finally:
        await manager.stop()
        await store.inner.close()


async def test_a_lapsed_lease_of_ones_own_names_no_leader(memory_target: StoreTarget) -> None:
    store = FaultyStore(open_state_store(memory_target.url))
    keeper = keeper_on(store)
    assert await keeper.acquire_once()
    assert keeper.leader == "cp-1"
    keeper.give_up()
    assert keeper.leader is None
    message = str(NotLeader("cp-1", keeper.leader))
    assert "no manager holds the lease right now; try again shortly" in message


@pytest.mark.parametrize(
    "delay",
    [
        pytest.param(Fault("delay", kinds=frozenset({"put_if_version"}), seconds=0.3), id="every-answer-slow"),
        pytest.param(Fault("delay", kinds=frozenset({"put_if_version"}), seconds=30, times=1), id="one-request-held"),
    ],
)
async def test_a_leader_keeps_its_lease_on_a_slow_store_and_past_a_held_request(
    memory_target: StoreTarget, caplog: pytest.LogCaptureFixture, delay: Fault
) -> None:
    """A slow answer is waited for (not abandoned and asked again from the start), and a
    request the store holds gets a second attempt beside it."""
    store = FaultyStore(open_state_store(memory_target.url))
    manager = manager_for(store, lease=Lease(ttl=TTL, holder="cp-1"))
    await manager.start()
    try:
        store.plan.faults.append(delay)
        with caplog.at_level(logging.WARNING, logger="procstore.lease"):
            await asyncio.sleep(TTL * 2.5)
        assert "stops leading" not in caplog.text
        assert manager.is_leader
    finally:
        await manager.stop()
        await store.inner.close()
