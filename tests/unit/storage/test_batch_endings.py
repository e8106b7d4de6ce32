"""An ending noted in a transaction wakes this process's long-polls when it commits, and never on a rollback."""

from __future__ import annotations

import asyncio

from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from storage.batch_endings import endings, note_ending, waiting


async def _after(commit: bool) -> bool:
    engine = create_engine("sqlite://")
    async with endings() as ended:
        assert waiting() >= 1
        with Session(engine) as session:
            session.execute(text("SELECT 1"))
            note_ending(session)
            assert not ended.is_set()  # not before the transaction ends
            if commit:
                session.commit()
            else:
                session.rollback()
        await asyncio.sleep(0)  # the wake-up is scheduled on this loop
        return ended.is_set()


def test_a_committed_ending_wakes_the_waiters_and_a_rolled_back_one_does_not() -> None:
    assert asyncio.run(_after(commit=True))
    assert not asyncio.run(_after(commit=False))
    assert waiting() == 0  # each waiter leaves on exit


def test_a_commit_without_an_ending_wakes_nobody() -> None:
    async def plain() -> bool:
        async with endings() as ended:
            with Session(create_engine("sqlite://")) as session:
                session.execute(text("SELECT 1"))
                session.commit()
            await asyncio.sleep(0)
            return ended.is_set()

    assert not asyncio.run(plain())
