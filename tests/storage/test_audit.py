"""The admin audit trail: entries as written, newest first, paged by the last id seen."""

from __future__ import annotations

import asyncpg

from llmgw.storage.audit import list_audit, write_audit


async def test_entries_come_back_newest_first_with_their_settings(db: asyncpg.Connection) -> None:
    await write_audit(db, actor="admin", action="key.create", target="llmg_aaaaaaa", after={"a": 1})
    await write_audit(
        db, actor="console", action="key.update", target="llmg_aaaaaaa", before={"a": 1}, after={}
    )
    await write_audit(db, actor="admin", action="sessions.revoke", target=None)

    newest, updated, created = await list_audit(db, limit=10)
    assert (newest.action, newest.target, newest.before, newest.after) == (
        "sessions.revoke", None, None, None,
    )  # fmt: skip
    assert (updated.actor, updated.before, updated.after) == ("console", {"a": 1}, {})
    assert (created.action, created.before, created.after) == ("key.create", None, {"a": 1})
    assert newest.id > updated.id > created.id
    assert newest.occurred_at >= created.occurred_at


async def test_pages_continue_from_the_last_entry_seen(db: asyncpg.Connection) -> None:
    for number in range(5):
        await write_audit(db, actor="admin", action=f"action.{number}", target=None)
    first = await list_audit(db, limit=2)
    second = await list_audit(db, limit=2, before_id=first[-1].id)
    last = await list_audit(db, limit=2, before_id=second[-1].id)
    pages = [[entry.action for entry in page] for page in (first, second, last)]
    assert pages == [["action.4", "action.3"], ["action.2", "action.1"], ["action.0"]]
