"""A throwaway PostgreSQL server for tests and benchmarks.

QueueProcessor's farm backend is PostgreSQL, and its hardest promises (one
owner per job, fencing, surviving a stalled database) only mean something
against a real server. `PostgresServer` initialises a private cluster in a
temporary directory on a free port, tuned for speed rather than durability,
and exposes the handles fault tests need: the postmaster `pid` (to SIGSTOP or
SIGCONT it) and `restart()`. A real password with scram-sha-256 on TCP makes
authentication failures testable.

Run ``python -m tests.support.pgserver`` to get a server for manual use.
"""

from __future__ import annotations

import atexit
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import psycopg
from psycopg import sql

__all__ = ["PostgresNotFound", "PostgresServer", "find_pg_bin"]

_HOST = "127.0.0.1"
_SETTINGS = {
    "listen_addresses": f"'{_HOST}'",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "300",
    "shared_buffers": "128MB",
}
_START_ATTEMPTS = 3  # a port picked by binding 0 can be taken before postgres binds it


class PostgresNotFound(RuntimeError):
    """No PostgreSQL server binaries were found on this machine."""


def find_pg_bin() -> Path:
    """Return the directory holding initdb/pg_ctl.

    Looks at ``$QP_PG_BIN``, then the newest /usr/lib/postgresql/*/bin (Debian's
    layout), then ``pg_config --bindir``.
    """
    candidates: list[Path] = []
    if os.environ.get("QP_PG_BIN"):
        candidates.append(Path(os.environ["QP_PG_BIN"]))
    versions = Path("/usr/lib/postgresql").glob("*/bin")
    candidates += sorted(versions, key=_version_key, reverse=True)
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        if out.returncode == 0:
            candidates.append(Path(out.stdout.strip()))
    for bindir in candidates:
        if (bindir / "initdb").is_file() and (bindir / "pg_ctl").is_file():
            return bindir
    raise PostgresNotFound(
        "PostgreSQL server binaries (initdb, pg_ctl) not found: set QP_PG_BIN to their "
        "directory or install them (Debian: apt-get install postgresql-15)"
    )


def _version_key(bindir: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", bindir.parent.name))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((_HOST, 0))
        return sock.getsockname()[1]


class PostgresServer:
    """A private PostgreSQL cluster on 127.0.0.1, removed again by `stop()`.

    As root, the cluster is owned and run by the ``postgres`` user (PostgreSQL
    refuses to run as root); otherwise by the current user.
    """

    user = "postgres"

    def __init__(self, bin_dir: str | os.PathLike | None = None) -> None:
        self.bin_dir = Path(bin_dir) if bin_dir else find_pg_bin()
        self.password = secrets.token_urlsafe(16)
        self.port: int | None = None
        self.base_dir: Path | None = None
        self.data_dir: Path | None = None

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the ``postgres`` database."""
        return self.url_for("postgres")

    def url_for(self, database: str) -> str:
        """SQLAlchemy URL of `database` on this server."""
        return f"postgresql+psycopg://{self.user}:{self.password}@{_HOST}:{self.port}/{database}"

    @property
    def pid(self) -> int:
        """The postmaster's process id, from postmaster.pid."""
        return int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])

    def start(self) -> PostgresServer:
        """Create the cluster and start the server; return self once it accepts connections."""
        if self.base_dir is not None:
            raise RuntimeError("server already started")
        self.base_dir = Path(tempfile.mkdtemp(prefix="qp-pg-"))
        self.data_dir = self.base_dir / "data"
        atexit.register(self.stop)
        try:
            socket_dir = self.base_dir / "sock"
            socket_dir.mkdir()
            if os.geteuid() == 0:
                shutil.chown(self.base_dir, self.user)
                shutil.chown(socket_dir, self.user)
            settings = dict(_SETTINGS, unix_socket_directories=f"'{socket_dir}'", **self._create_cluster())
            for attempt in range(_START_ATTEMPTS):
                self.port = _free_port()
                settings["port"] = str(self.port)
                conf = "".join(f"{key} = {value}\n" for key, value in settings.items())
                (self.data_dir / "postgresql.auto.conf").write_text(conf)
                try:
                    self._pg_ctl("start", "-l", self.base_dir / "server.log")
                    break
                except RuntimeError:
                    if attempt + 1 == _START_ATTEMPTS or "already in use" not in self.log():
                        raise
        except BaseException:
            self.stop()
            raise
        return self

    def restart(self, mode: str = "fast") -> None:
        """Restart on the same port and data (`mode` is pg_ctl's shutdown mode)."""
        self._resume()
        self._pg_ctl("restart", "-m", mode, "-l", self.base_dir / "server.log")

    def _create_cluster(self) -> dict[str, str]:
        """Make the data directory; return the settings it needs besides the common ones (initdb's: none)."""
        pwfile = self.base_dir / "pwfile"
        pwfile.write_text(self.password + "\n")
        if os.geteuid() == 0:
            shutil.chown(pwfile, self.user)
        self._run(
            "initdb",
            "-D",
            self.data_dir,
            "-U",
            self.user,
            f"--pwfile={pwfile}",
            "--auth-host=scram-sha-256",
            "--auth-local=trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )
        pwfile.unlink()
        return {}

    def halt(self, mode: str = "fast") -> None:
        """Shut the server down and keep its files (stop() deletes them): a primary that goes away."""
        self._resume()
        self._pg_ctl("stop", "-m", mode)

    def stop(self) -> None:
        """Kill the server (immediate mode, no checkpoint) and delete its files."""
        atexit.unregister(self.stop)
        if self.base_dir is None:
            return
        try:
            if (self.data_dir / "postmaster.pid").exists():
                self._resume()
                self._pg_ctl("stop", "-m", "immediate")
        finally:
            shutil.rmtree(self.base_dir, ignore_errors=True)
            self.base_dir = self.data_dir = None

    def create_database(self, name: str) -> str:
        """Create an empty database and return its SQLAlchemy URL."""
        conninfo = psycopg.conninfo.make_conninfo(
            host=_HOST, port=self.port, user=self.user, password=self.password, dbname="postgres"
        )
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url_for(name)

    def log(self) -> str:
        """The server's log so far (for diagnosing failures)."""
        try:
            return (self.base_dir / "server.log").read_text(errors="replace")
        except (OSError, TypeError):
            return ""

    def _resume(self) -> None:
        # A test may have SIGSTOPped the postmaster; a stopped process cannot shut down.
        try:
            os.kill(self.pid, signal.SIGCONT)
        except (OSError, ValueError):
            pass

    def _pg_ctl(self, action: str, *args: object) -> None:
        self._run("pg_ctl", action, "-D", self.data_dir, "-w", "-t", "60", *args)

    def _run(self, program: str, *args: object) -> None:
        cmd = [str(self.bin_dir / program), *map(str, args)]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        done = subprocess.run(cmd, cwd=self.base_dir, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout}{done.stderr}{self.log()[-2000:]}"
            )

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


if __name__ == "__main__":
    with PostgresServer() as server:
        print(server.url, flush=True)
        stop_signals = {signal.SIGINT, signal.SIGTERM}
        signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
        signal.sigwait(stop_signals)  # Ctrl-C or kill: stop the server on the way out
