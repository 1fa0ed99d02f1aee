"""What `Client` refuses before it reads or writes anything: a status or outcome word it
does not know (which would match nothing), a reason that is not valid Unicode."""

from __future__ import annotations

import pytest

from procstore import Client
from tests.runtime.test_operations import failed_and_kept, manager_on


@pytest.mark.parametrize("word", ["committed", "Done", "canceled"])
async def test_an_unknown_status_or_outcome_word_is_refused_naming_the_words(word: str) -> None:
    async with Client("memory://client-words/") as client:
        with pytest.raises(ValueError, match=f"unknown status '{word}'.*done, failed, rolled back"):
            await client.list(status=word)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="unknown status"):
            await client.list(status=["done", word])  # type: ignore[list-item]
        with pytest.raises(ValueError, match=f"unknown outcome '{word}'.*cancelled, poisoned"):
            await client.history(outcome=word)  # type: ignore[arg-type]
        assert await client.list(status="rolled back") == []


async def test_a_reason_with_a_lone_surrogate_is_refused_before_anything_is_written(tmp_path: object) -> None:
    url = f"memory://client-surrogate-{id(tmp_path)}/"
    async with manager_on(url, keep_failed=True) as manager:
        pid, _ = await failed_and_kept(manager)
        async with Client(url) as client:
            with pytest.raises(ValueError, match="lone surrogate"):
                await client.resume(pid, reason="bad \ud800 reason")
            with pytest.raises(ValueError, match="lone surrogate"):
                await client.rewind(pid, 0, reason="\udfff")
            assert (await client.get(pid)).pending is None
            assert not await manager.store.resumes.list_all()
