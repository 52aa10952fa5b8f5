"""A streaming standby of a test PostgreSQL server, for failover tests.

`pg_basebackup -R` copies the primary's cluster (its users and password too) and the connection back to it
(primary_conninfo, standby.signal); the copy starts on a port of its own as a read-only hot standby that
replays the primary's WAL as it streams. `promote()` makes it the primary.
"""

from __future__ import annotations

from .pgserver import _HOST, PostgresServer

__all__ = ["StandbyServer"]


class StandbyServer(PostgresServer):
    """A hot standby of `primary` on 127.0.0.1; stop() removes it like any test server."""

    def __init__(self, primary: PostgresServer) -> None:
        super().__init__(primary.bin_dir)
        self.primary = primary
        self.password = primary.password

    def _create_cluster(self) -> dict[str, str]:
        source = f"host={_HOST} port={self.primary.port} user={self.user} password={self.password}"
        self._run("pg_basebackup", "-D", self.data_dir, "-d", source, "-R", "-X", "stream", "-c", "fast", "--no-sync")
        written = (self.data_dir / "postgresql.auto.conf").read_text().splitlines()
        return dict(line.split(" = ", 1) for line in written if line.startswith("primary_conninfo"))

    def promote(self) -> None:
        """End recovery: from now on this server takes writes."""
        self._pg_ctl("promote")
