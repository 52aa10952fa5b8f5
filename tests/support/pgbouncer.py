"""A throwaway PgBouncer in transaction pooling mode, in front of a `PostgresServer` (tests and benchmarks).

A farm reached through PgBouncer (Debian's pgbouncer 1.18: no prepared
statements kept past a transaction, no LISTEN) must work as one reached
directly; only a real one shows that. `PgBouncer` writes its configuration in a
temporary directory, listens on a free port of 127.0.0.1, passes every database
to the server with the server's own user and password (SCRAM on both sides),
and exposes `restart()` for the fault tests. As root it runs as the ``postgres``
user, as the server does (PgBouncer refuses to run as root).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from sqlalchemy.engine import make_url

from tests.support.pgserver import PostgresServer, _free_port

__all__ = ["PgBouncer", "find_pgbouncer"]

_HOST = "127.0.0.1"


def find_pgbouncer() -> str:
    """The pgbouncer program: $QP_PGBOUNCER, on PATH, or Debian's /usr/sbin/pgbouncer."""
    for candidate in (os.environ.get("QP_PGBOUNCER"), shutil.which("pgbouncer"), "/usr/sbin/pgbouncer"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError("pgbouncer not found: set QP_PGBOUNCER or install it (Debian: apt-get install pgbouncer)")


def _running(pid: int) -> bool:
    """Is the process there and not a zombie (a daemon's parent is init, which may be slow to reap it)?"""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class PgBouncer:
    """PgBouncer in transaction mode on 127.0.0.1, in front of `server`; removed again by `stop()`."""

    def __init__(self, server: PostgresServer, pool_size: int = 20) -> None:
        self.server = server
        self.pool_size = pool_size
        self.program = find_pgbouncer()
        self.port: int | None = None
        self.base_dir: Path | None = None

    def url_for(self, direct_url: str) -> str:
        """The same database as `direct_url` (a URL of `server`), reached through this PgBouncer."""
        return make_url(direct_url).set(port=self.port).render_as_string(hide_password=False)

    @property
    def pid(self) -> int:
        return int((self.base_dir / "pgbouncer.pid").read_text())

    def start(self) -> PgBouncer:
        self.base_dir = Path(tempfile.mkdtemp(prefix="qp-pgbouncer-"))
        self.port = _free_port()
        (self.base_dir / "userlist.txt").write_text(f'"{self.server.user}" "{self.server.password}"\n')
        (self.base_dir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={_HOST} port={self.server.port}\n"
            "[pgbouncer]\n"
            f"listen_addr = {_HOST}\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = scram-sha-256\nauth_file = {self.base_dir / 'userlist.txt'}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {self.pool_size}\nmax_client_conn = 1000\n"
            f"logfile = {self.base_dir / 'pgbouncer.log'}\npidfile = {self.base_dir / 'pgbouncer.pid'}\n"
        )
        if os.geteuid() == 0:
            shutil.chown(self.base_dir, "postgres")
            for path in self.base_dir.iterdir():
                shutil.chown(path, "postgres")
            os.chmod(self.base_dir / "userlist.txt", 0o600)
        self._launch()
        return self

    def restart(self) -> None:
        """Stop at once (every client connection cut, as a crash or a deploy does), then start on the same port."""
        self._kill()
        self._launch()

    def stop(self) -> None:
        if self.base_dir is None:
            return
        try:
            self._kill()
        finally:
            shutil.rmtree(self.base_dir, ignore_errors=True)
            self.base_dir = None

    def log(self) -> str:
        try:
            return (self.base_dir / "pgbouncer.log").read_text(errors="replace")
        except (OSError, TypeError):
            return ""

    def _launch(self) -> None:
        command = [self.program, "-d", str(self.base_dir / "pgbouncer.ini")]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr}{self.log()[-2000:]}")
        deadline = time.monotonic() + 10
        while "process up" not in self.log():
            if time.monotonic() > deadline:
                raise RuntimeError(f"pgbouncer did not start:\n{self.log()[-2000:]}")
            time.sleep(0.02)

    def _kill(self) -> None:
        try:
            pid = self.pid
        except (OSError, ValueError):
            return
        os.kill(pid, signal.SIGTERM)  # immediate shutdown: every client connection cut
        deadline = time.monotonic() + 10
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        (self.base_dir / "pgbouncer.log").write_text("")  # so a restart waits for its own "process up"

    def __enter__(self) -> PgBouncer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
