"""The farm's settings (qp_meta): what every node of the farm agrees on, first stored wins."""

from sqlalchemy import exc, insert, select

from .base import StoreBase
from .schema import meta


class SettingsStore:
    def __init__(self, store: StoreBase):
        self.store = store

    def read(self) -> dict[str, str]:
        return {k: v for k, v in self.store.rows(select(meta.c.key, meta.c.value))}

    def adopt(self, wanted: dict[str, str]) -> dict[str, str]:
        """Store settings the farm does not have yet; return the farm's settings (old ones win)."""
        have = self.read()
        for key, value in wanted.items():
            if key not in have:
                try:
                    self.store.count(insert(meta).values(key=key, value=value))
                except exc.IntegrityError:
                    pass  # another node stored it first; theirs stands
        return self.read()
