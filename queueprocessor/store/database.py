"""Opening a farm database: URLs, engines, schema creation and the version check (urls: the default URL and
masking, which need no engine); and telling a database out of reach from any other error."""

import re
import socket
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, exc, insert, inspect, select
from sqlalchemy.engine import URL, Connection, Engine, make_url

from ..rules.errors import BadSetting, ConfigError, DatabaseUnavailable, NotFound, SchemaTooNew, UnusableDatabase
from ..rules.urls import mask
from . import connections, migrations, permissions, schema
from .sqlfunctions import create_sql_functions

# Short names a user may type, mapped to the driver we ship.
_DRIVERS = {"postgresql": "postgresql+psycopg", "postgres": "postgresql+psycopg", "mssql": "mssql+pyodbc"}
CONNECT_TIMEOUT = 10  # seconds
PROGRAM = "queueprocessor"  # how a process's connections are labelled on the server (see client_name)
APP_PROGRAM = "queueprocessor-gui"  # the desktop app's
# A node's statements take one connection at a time, but for its results, whose connection store.Held keeps
# while the node is busy and for a few seconds after: the pool keeps one, opens a second only while both are
# wanted at once, and closes it when given back, so an idle node holds one connection and a busy one two,
# whatever its capacity. Other threads wait their turn for them.
POOL_OVERFLOW = 1
_TIMEOUT_ARG = {"postgresql": "connect_timeout", "mssql": "timeout"}  # each driver's name for it
_ODBC_PASSWORD = re.compile(r"(?:^|;)\s*(?:password|pwd)\s*=(?:\{[^}]*\}?)?[^;]*", re.IGNORECASE)


def without_password(text: str) -> str:
    """The URL with no password at all, in its user part, query or ODBC connection string: what may be
    remembered (the app's recent databases)."""
    url = parse_url(text)
    query = {k: v for k, v in url.query.items() if k.lower() not in ("password", "pwd")}
    if "odbc_connect" in query:
        query["odbc_connect"] = _ODBC_PASSWORD.sub("", query_value(query["odbc_connect"]))
    # URL.set() ignores None, so drop the password through the named tuple itself.
    return url._replace(password=None).set(query=query).render_as_string(hide_password=False)


def parse_url(text: str) -> URL:
    try:
        url = make_url(text)
    except (exc.ArgumentError, ValueError):
        raise ConfigError(
            f"malformed database URL {mask(text)!r}: expected e.g. "
            "sqlite:///path/farm.db or postgresql://user:password@host/dbname"
        ) from None
    if url.host and "@" in url.host:  # an "@" in the password, unencoded: the driver's errors would show the rest
        raise ConfigError(
            f"the password in the database URL {mask(text)} contains '@': write it as %40, "
            "e.g. postgresql://user:p%40ss@host/dbname"
        )
    if url.get_backend_name() == "sqlite" and (url.host or url.port):  # sqlite://rel/path: "rel" is a host
        raise ConfigError(
            f"the SQLite URL {mask(url)} names a host: a file takes three slashes, e.g. "
            "sqlite:///relative/farm.db, or four for an absolute path, sqlite:////srv/qp/farm.db"
        )
    if url.drivername in _DRIVERS:
        url = url.set(drivername=_DRIVERS[url.drivername])
    if url.get_backend_name() not in ("sqlite", "postgresql", "mssql"):
        raise ConfigError(
            f"unsupported database {url.get_backend_name()!r} in {mask(url)}: use sqlite, postgresql or mssql"
        )
    if url.get_backend_name() == "mssql" and url.host and not {"driver", "odbc_connect"} & set(url.query):
        raise ConfigError(
            f"the SQL Server URL {mask(url)} does not name its ODBC driver: add "
            "?driver=ODBC+Driver+18+for+SQL+Server (or the driver installed on this machine)"
        )
    return url


def listen_url(text: str) -> URL:
    """A node's listen_db: the PostgreSQL server itself, for push when the farm's URL reaches a pooler. Errors
    name the setting as its front end spells it (the CLI: --listen-db)."""
    try:
        url = parse_url(text)
    except ConfigError as error:
        raise BadSetting("{0}: {reason}", "listen_db", reason=str(error)) from None
    if url.get_backend_name() != "postgresql":
        raise BadSetting(
            "{0} {url} is not a PostgreSQL URL: push listens on PostgreSQL only; give the server's own "
            "address, e.g. postgresql://user:password@dbhost:5432/farm",
            "listen_db",
            url=mask(url),
        )
    return url


def query_value(value: str | tuple[str, ...]) -> str:
    """A URL's query parameter as one string: SQLAlchemy gives one named more than once as a tuple (the last
    counts, as with a driver's keywords)."""
    return value if isinstance(value, str) else value[-1]


def client_name(machine: str | None = None, program: str = PROGRAM) -> str:
    """The label on every connection this process opens ('queueprocessor web-3'), so a database administrator
    sees in pg_stat_activity (SQL Server: sys.dm_exec_sessions) which machine holds what."""
    return f"{program} {machine or socket.gethostname()}"


def labelled(url: URL, client: str) -> URL:
    """The URL with `client` as its connections' application_name (PostgreSQL) or APP (SQL Server), unless
    the URL names one itself."""
    backend, query = url.get_backend_name(), url.query
    if backend == "postgresql" and "application_name" not in query:
        return url.update_query_dict({"application_name": client})
    if backend != "mssql":
        return url
    if "odbc_connect" in query:  # a whole connection string, passed on as it is
        given = query_value(query["odbc_connect"])
        if re.search(r"(?:^|;)\s*app\s*=", given, re.IGNORECASE):
            return url
        return url.update_query_dict({"odbc_connect": f"{given.rstrip(';')};APP={_odbc_value(client)}"})
    return url if any(key.lower() == "app" for key in query) else url.update_query_dict({"APP": client})


def _odbc_value(value: str) -> str:
    """A value as an ODBC connection string takes it: in braces when it holds a separator."""
    return "{" + value.replace("}", "}}") + "}" if ";" in value or "}" in value or value.startswith("{") else value


def unlabelled(url: URL) -> URL:
    """The URL without connection labels (for messages)."""
    return url.difference_update_query(["application_name", "APP"])


def open_engine(text: str, pool_size: int = 1, read_only: bool = False, client: str | None = None) -> Engine:
    """An engine tuned for the farm's access pattern (short statements, several threads, few connections: see
    POOL_OVERFLOW). With `read_only` the database itself refuses every write on its connections (the app's
    watch-only mode; not through a pooler, see store/connections.py). Its connections carry `client` (default:
    client_name())."""
    url = parse_url(text)
    if url.get_backend_name() == "sqlite":
        return _sqlite_engine(url, read_only)
    # A server that accepts the connection and never answers would hang every command: give up after
    # CONNECT_TIMEOUT, unless the URL asks for its own timeout.
    timeout = _TIMEOUT_ARG[url.get_backend_name()]
    connect_args = {} if timeout in url.query else {timeout: CONNECT_TIMEOUT}
    url = labelled(url, client or client_name())
    postgresql = url.get_backend_name() == "postgresql"  # its checkouts are checked without a ping (connections)
    engine = _create_engine(
        url,
        pool_size=pool_size,
        max_overflow=POOL_OVERFLOW,
        pool_pre_ping=not postgresql,
        pool_recycle=300,
        connect_args=connect_args,
    )
    if postgresql:
        connections.prepare(engine, read_only)
    return engine


def _create_engine(url: URL, **options: Any) -> Engine:
    try:
        return create_engine(url, **options)
    except ImportError as error:  # the driver, or a library it loads (pyodbc needs unixODBC's libodbc)
        missing = error.name if isinstance(error, ModuleNotFoundError) else str(error).split(":")[0]
        raise ConfigError(
            f"the driver for {mask(url)} cannot be loaded ({missing}): install it on this machine"
        ) from None


def _sqlite_engine(url: URL, read_only: bool = False) -> Engine:
    path = permissions.sqlite_path(url)
    if path and (read_only or not permissions.sqlite_writable(url)):
        if not Path(path).expanduser().exists():
            raise _no_farm(url)
    elif path:
        folder = Path(path).expanduser().parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ConfigError(
                f"cannot use the SQLite database {url.database}: its folder {folder} cannot be "
                f"created ({error.strerror})"
            ) from None
    engine = _create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: object) -> None:
        # Let SQLAlchemy own transactions; WAL lets readers run beside the one writer.
        dbapi_connection.isolation_level = None
        dbapi_connection.execute("PRAGMA journal_mode=WAL")
        dbapi_connection.execute("PRAGMA synchronous=NORMAL")
        dbapi_connection.execute("PRAGMA busy_timeout=30000")
        if read_only:
            dbapi_connection.execute("PRAGMA query_only=ON")

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        # Writers take the write lock up front: a deferred transaction that later
        # writes fails at once with "database is locked" instead of waiting its
        # turn. Reads (marked read_only) must not queue behind the writers.
        reading = read_only or connection.get_execution_options().get("read_only")
        connection.exec_driver_sql("BEGIN" if reading else "BEGIN IMMEDIATE")

    return engine


def describe_failure(error: exc.DBAPIError, url: str | URL) -> DatabaseUnavailable:
    """Turn a driver error into one line that names the database (masked) and a next step."""
    reason = str(getattr(error, "orig", error)).strip().splitlines()[0] if str(error) else type(error).__name__
    sqlite = str(url).startswith("sqlite") if not isinstance(url, URL) else url.get_backend_name() == "sqlite"
    hint = (
        "check that the file is a QueueProcessor farm's SQLite database, or name another with {0}"
        if sqlite
        else "check the URL, that the server is running, and the user name and password"
    )
    return UnusableDatabase(
        "cannot use the database {url}: {reason} — " + hint,
        *(("db",) if sqlite else ()),
        url=mask(url),
        reason=mask(reason),
    )


def unreachable(error: Exception) -> bool:
    """Is this the database being out of reach (refused, dropped, timed out, locked), not a statement it refused
    or a fault of ours? Only then does a node say the database is unreachable."""
    return isinstance(error, (exc.OperationalError, exc.InterfaceError, exc.TimeoutError, OSError)) or bool(
        getattr(error, "connection_invalidated", False)
    )


def ensure_schema(engine: Engine) -> bool:
    """Create the tables if missing, upgrade an older schema (see migrations); refuse a schema newer than
    this code. True if created.

    Several nodes may start at once on an empty database: a loser of the
    creation race simply finds the tables there on its next try.
    """
    schema.partial_for(engine.dialect.name)
    for attempt in range(3):
        try:
            created = _create_or_check(engine)
            if not created:
                migrations.upgrade(engine)
            return created
        except (exc.IntegrityError, exc.ProgrammingError):
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def check_schema(engine: Engine) -> None:
    """For a reader that must change nothing: the farm's tables must be there already, and not newer."""
    with engine.connect() as conn:
        if _schema_version(conn) is None:
            raise _no_farm(unlabelled(engine.url))


def _no_farm(url: URL) -> NotFound:
    return NotFound(
        f"there is no QueueProcessor farm in {mask(url)} yet: start a node there", what="farm", ref=mask(url)
    )


def _schema_version(conn: Connection) -> str | None:
    version = None
    if inspect(conn).has_table(schema.meta.name):
        version = conn.execute(select(schema.meta.c.value).where(schema.meta.c.key == "schema_version")).scalar()
    if version is not None and int(version) > schema.SCHEMA_VERSION:
        raise SchemaTooNew(
            f"this database has schema version {version}, newer than this QueueProcessor's "
            f"{schema.SCHEMA_VERSION}: upgrade QueueProcessor on this machine before joining the farm"
        )
    return version


def _create_or_check(engine: Engine) -> bool:
    with engine.begin() as conn:
        version = _schema_version(conn)
        schema.metadata.create_all(conn)
        if version is None:
            conn.execute(insert(schema.meta).values(key="schema_version", value=str(schema.SCHEMA_VERSION)))
            create_sql_functions(conn)
        return version is None
