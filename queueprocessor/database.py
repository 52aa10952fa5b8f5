"""Opening a farm database: URLs, engines, schema creation and the version check."""

import re
from pathlib import Path

import platformdirs
from sqlalchemy import create_engine, event, exc, insert, inspect, select
from sqlalchemy.engine import URL, Engine, make_url

from . import schema
from .errors import ConfigError, DatabaseUnavailable, NotFound, SchemaTooNew

# Short names a user may type, mapped to the driver we ship.
_DRIVERS = {"postgresql": "postgresql+psycopg", "postgres": "postgresql+psycopg", "mssql": "mssql+pyodbc"}
# From "user:" to the last "@": people type passwords with spaces, "@" and "/" in them unencoded, and a
# mask that shows too much is worse than one that hides a host name too.
_PASSWORD_IN_URL = re.compile(r"(://[^:/@]*:).*@", re.DOTALL)


def default_url() -> str:
    """The embedded default: one SQLite file in the user's data directory."""
    folder = Path(platformdirs.user_data_dir("queueprocessor"))
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'farm.db'}"


def mask(url: str | URL) -> str:
    """The URL with its password replaced by ***, safe to log or show."""
    text = url.render_as_string(hide_password=True) if isinstance(url, URL) else str(url)
    return _PASSWORD_IN_URL.sub(r"\1***@", text)


def parse_url(text: str) -> URL:
    try:
        url = make_url(text)
    except (exc.ArgumentError, ValueError):
        raise ConfigError(
            f"malformed database URL {mask(text)!r}: expected e.g. "
            "sqlite:///path/farm.db or postgresql://user:password@host/dbname"
        ) from None
    if url.host and "@" in url.host:  # an "@" in the password, unencoded: the driver's errors would show the rest
        raise ConfigError(f"the password in the database URL {mask(text)} contains '@': write it as %40, "
                          "e.g. postgresql://user:p%40ss@host/dbname")
    if url.drivername in _DRIVERS:
        url = url.set(drivername=_DRIVERS[url.drivername])
    if url.get_backend_name() not in ("sqlite", "postgresql", "mssql"):
        raise ConfigError(
            f"unsupported database {url.get_backend_name()!r} in {mask(url)}: use sqlite, postgresql or mssql"
        )
    if url.get_backend_name() == "mssql" and url.host and not {"driver", "odbc_connect"} & set(url.query):
        raise ConfigError(f"the SQL Server URL {mask(url)} does not name its ODBC driver: add "
                          "?driver=ODBC+Driver+18+for+SQL+Server (or the driver installed on this machine)")
    return url


def open_engine(text: str, pool_size: int = 5, read_only: bool = False) -> Engine:
    """An engine tuned for the farm's access pattern (short statements, several threads). With `read_only`
    the database itself refuses every write on its connections (the app's watch-only mode)."""
    url = parse_url(text)
    if url.get_backend_name() == "sqlite":
        return _sqlite_engine(url, read_only)
    try:
        engine = create_engine(url, pool_size=pool_size, max_overflow=4, pool_pre_ping=True, pool_recycle=300)
    except ImportError as error:  # the driver, or a library it loads (pyodbc needs unixODBC's libodbc)
        missing = error.name if isinstance(error, ModuleNotFoundError) else str(error).split(":")[0]
        raise ConfigError(f"the driver for {mask(url)} cannot be loaded ({missing}): install it on this machine") from None
    if read_only and url.get_backend_name() == "postgresql":

        @event.listens_for(engine, "connect")
        def _refuse_writes(dbapi_connection, _record):
            with dbapi_connection.cursor() as cursor:
                cursor.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
            dbapi_connection.commit()  # a SET inside a transaction that is rolled back would be undone

    return engine


def _sqlite_engine(url: URL, read_only: bool = False) -> Engine:
    if url.database and url.database != ":memory:" and read_only:
        if not Path(url.database).expanduser().exists():
            raise _no_farm(url)
    elif url.database and url.database != ":memory:":
        folder = Path(url.database).expanduser().parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ConfigError(f"cannot use the SQLite database {url.database}: its folder {folder} cannot be "
                              f"created ({error.strerror})") from None
    engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record):
        # Let SQLAlchemy own transactions; WAL lets readers run beside the one writer.
        dbapi_connection.isolation_level = None
        dbapi_connection.execute("PRAGMA journal_mode=WAL")
        dbapi_connection.execute("PRAGMA synchronous=NORMAL")
        dbapi_connection.execute("PRAGMA busy_timeout=30000")
        if read_only:
            dbapi_connection.execute("PRAGMA query_only=ON")

    @event.listens_for(engine, "begin")
    def _on_begin(connection):
        # Writers take the write lock up front: a deferred transaction that later
        # writes fails at once with "database is locked" instead of waiting its
        # turn. Reads (marked read_only) must not queue behind the writers.
        reading = read_only or connection.get_execution_options().get("read_only")
        connection.exec_driver_sql("BEGIN" if reading else "BEGIN IMMEDIATE")

    return engine


def describe_failure(error: exc.DBAPIError, url: str | URL) -> DatabaseUnavailable:
    """Turn a driver error into one line that names the database (masked) and a next step."""
    reason = str(getattr(error, "orig", error)).strip().splitlines()[0] if str(error) else type(error).__name__
    return DatabaseUnavailable(
        f"cannot use the database {mask(url)}: {mask(reason)} — check the URL, that the server is running, "
        "and the user name and password"
    )


def ensure_schema(engine: Engine) -> bool:
    """Create the tables if missing; refuse a schema newer than this code. True if created.

    Several nodes may start at once on an empty database: a loser of the
    creation race simply finds the tables there on its next try.
    """
    for attempt in range(3):
        try:
            return _create_or_check(engine)
        except (exc.IntegrityError, exc.ProgrammingError):
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def check_schema(engine: Engine) -> None:
    """For a reader that must change nothing: the farm's tables must be there already, and not newer."""
    with engine.connect() as conn:
        if _schema_version(conn) is None:
            raise _no_farm(engine.url)


def _no_farm(url: URL) -> NotFound:
    return NotFound(f"there is no QueueProcessor farm in {mask(url)} yet: start a node there, or run "
                    "`queueprocessor init-db`")


def _schema_version(conn) -> str | None:
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
        return version is None
