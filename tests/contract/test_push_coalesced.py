"""Coalesced push on PostgreSQL (store/sql/push.py): a commit that queues work notifies at most once per short
interval for the whole farm, decided as it commits, and a writer never waits for another to decide."""

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from queueprocessor.farm import Farm
from queueprocessor.rules.job import JobSpec
from queueprocessor.store import schema
from tests.contract.test_migrations import make_version_12

pytestmark = pytest.mark.postgres
JOB = JobSpec(executor="python", target="bench.jobs:noop", max_attempts=1)


@pytest.fixture
def farm(pg_url):
    with Farm(pg_url) as the_farm:
        yield the_farm


def dsn(farm) -> str:
    return make_url(farm.url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture
def listener(farm):
    with psycopg.connect(dsn(farm), autocommit=True) as conn:
        conn.execute(f"LISTEN {schema.JOBS_CHANNEL}")
        yield conn


def heard(listener, wait: float = 0.3) -> int:
    """The notices that arrive within `wait` seconds of the last one (a notice sent arrives in milliseconds)."""
    return sum(1 for _ in listener.notifies(timeout=wait))


def last_notice_long_ago(farm) -> None:
    with farm._engine.begin() as conn:
        conn.execute(text("UPDATE qp_push SET notified_at = 0"))


def test_a_transaction_that_queues_many_jobs_notifies_once_as_it_commits(farm, listener):
    last_notice_long_ago(farm)
    with farm._engine.connect() as conn:
        with conn.begin():
            for _ in range(3):  # three statements, three jobs: the first queues the commit's push, alone
                conn.execute(text("SELECT qp_enqueue('python', 'bench.jobs:noop')"))
            assert conn.execute(text("SELECT current_setting('qp.push', true)")).scalar() == "on"
            assert heard(listener) == 0
    assert heard(listener) == 1


def test_a_commit_while_another_notifies_neither_waits_nor_notifies(farm, listener):
    """The throttle row locked stands for a commit sending its notice right now: the writer skips its own, at once."""
    last_notice_long_ago(farm)
    with psycopg.connect(dsn(farm)) as notifying, psycopg.connect(dsn(farm), autocommit=True) as writer:
        notifying.execute("SELECT 1 FROM qp_push FOR UPDATE")
        writer.execute("SET lock_timeout = '2s'")  # a writer that waited would fail here instead
        writer.execute("SELECT qp_enqueue('python', 'bench.jobs:noop')")
        assert heard(listener) == 0
        notifying.rollback()
    last_notice_long_ago(farm)
    with psycopg.connect(dsn(farm), autocommit=True) as writer:
        writer.execute("SELECT qp_enqueue('python', 'bench.jobs:noop')")
    assert heard(listener) == 1


def test_a_notice_recorded_ahead_of_the_database_clock_does_not_silence_the_farm(farm, listener):
    """A notice a minute ahead of now means the server's clock stepped back: the writer notifies, and the row is
    set to now again."""
    with farm._engine.begin() as conn:
        conn.execute(text("UPDATE qp_push SET notified_at = extract(epoch FROM clock_timestamp()) + 60"))
    with psycopg.connect(dsn(farm), autocommit=True) as writer:
        writer.execute("SELECT qp_enqueue('python', 'bench.jobs:noop')")
    assert heard(listener) == 1
    with farm._engine.connect() as conn:
        assert conn.execute(text("SELECT notified_at < extract(epoch FROM clock_timestamp()) FROM qp_push")).scalar()


def test_under_repeatable_read_a_commit_always_notifies(farm, listener):
    """Locking a row changed since its snapshot would fail the writer's commit: it notifies as before instead."""
    with psycopg.connect(dsn(farm)) as notifying, psycopg.connect(dsn(farm)) as writer:
        notifying.execute("SELECT 1 FROM qp_push FOR UPDATE")
        writer.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        writer.execute("SELECT qp_enqueue('python', 'bench.jobs:noop')")
        writer.commit()
        assert heard(listener) == 1
        notifying.rollback()


def test_a_waiting_job_notifies_nobody(farm, listener):
    [parent] = farm.enqueue_python("bench.jobs:noop")
    heard(listener)
    last_notice_long_ago(farm)
    farm.enqueue(farm.python_spec("bench.jobs:noop", after=[parent]))
    assert heard(listener) == 0


def test_a_version_12_database_gets_coalesced_push_in_place(pg_url):
    make_version_12(pg_url)
    with Farm(pg_url) as farm:
        with farm._engine.connect() as conn:
            triggers = set(
                conn.execute(text("SELECT tgname FROM pg_trigger WHERE tgrelid = 'qp_jobs'::regclass")).scalars()
            )
            version = conn.execute(text("SELECT value FROM qp_meta WHERE key = 'schema_version'")).scalar()
        assert version == str(schema.SCHEMA_VERSION) and "qp_jobs_push" in triggers and "qp_jobs_notify" not in triggers
        with psycopg.connect(dsn(farm), autocommit=True) as listener:
            listener.execute(f"LISTEN {schema.JOBS_CHANNEL}")
            with psycopg.connect(dsn(farm), autocommit=True) as writer:
                writer.execute("SELECT qp_enqueue('python', 'bench.jobs:noop')")
            assert heard(listener) == 1
