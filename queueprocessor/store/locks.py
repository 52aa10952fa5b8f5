"""The statements behind locks (the rules are in singletons): a named lease in qp_locks that one holder
keeps by renewing it. Taking it bumps its fence, so a holder that lost it can be told apart downstream;
every later write quotes the holder and the fence it took."""

from sqlalchemy import ColumnElement, and_, exc, insert, or_, select, update

from .base import StoreBase
from .dbtime import db_now
from .schema import locks


class LockStore:
    def __init__(self, store: StoreBase):
        self.store = store

    def take(self, name: str, holder: str, lease: float) -> int | None:
        """Take a free or expired lease for `lease` seconds; its new fence, or None if someone holds it."""
        now = db_now()
        rows = self.store.rows(
            update(locks)
            .where(locks.c.name == name, or_(locks.c.holder.is_(None), locks.c.lease_until < now))
            .values(holder=holder, fence=locks.c.fence + 1, lease_until=now + lease, acquired_at=now)
            .returning(locks.c.fence)
        )
        if rows:
            fence: int = rows[0][0]
            return fence
        try:
            self.store.count(
                insert(locks).values(
                    name=name, holder=holder, fence=1, lease_until=db_now() + lease, acquired_at=db_now()
                )
            )
        except exc.IntegrityError:  # someone took it first
            return None
        return 1

    def renew(self, name: str, holder: str, fence: int, lease: float) -> bool:
        """Extend our lease from the database's now; False if it is no longer ours. One that ran out untaken is
        extended too: its holder and fence prove that nobody took it meanwhile."""
        return (
            self.store.count(update(locks).where(_ours(name, holder, fence)).values(lease_until=db_now() + lease)) == 1
        )

    def give_back(self, name: str, holder: str, fence: int) -> None:
        self.store.count(update(locks).where(_ours(name, holder, fence)).values(holder=None, lease_until=None))

    def holder(self, name: str) -> str | None:
        """Who holds the lease now (None: nobody, or it ran out)."""
        rows = self.store.rows(select(locks.c.holder).where(locks.c.name == name, locks.c.lease_until > db_now()))
        return rows[0][0] if rows else None


def _ours(name: str, holder: str, fence: int) -> ColumnElement[bool]:
    return and_(locks.c.name == name, locks.c.holder == holder, locks.c.fence == fence)
