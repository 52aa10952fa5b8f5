"""An operator whose database user may only read: the Farm knows it on connect, and every write it is asked for,
through the API or the CLI, is refused in one line that names the user and where the GRANTs are written.

The roles are real PostgreSQL roles made with the GRANTs docs/operations.md gives; SQLite is opened with mode=ro.
"""

import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from queueprocessor.farm import Farm
from queueprocessor.rules.errors import ReadOnly
from queueprocessor.store.database import open_engine
from tests.acceptance.test_bad_input import run_cli, snapshot
from tests.acceptance.test_security import prepare_farm

# docs/operations.md, "Operators who may only look": the same statements.
READER_GRANTS = [
    "GRANT CONNECT ON DATABASE {database} TO {role}",
    "GRANT USAGE ON SCHEMA public TO {role}",
    "GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}",
]
OPERATOR_GRANTS = [
    *READER_GRANTS,
    "GRANT INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}",
    "GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role}",
]


def role_url(owner_url: str, grants: list[str]) -> str:
    """A new login role on the owner's database, given `grants`; its URL."""
    role, password = f"viewer_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    url = make_url(owner_url)
    engine = open_engine(owner_url, pool_size=1)
    try:
        with engine.begin() as conn:
            conn.execute(text(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'"))
            for grant in grants:
                conn.execute(text(grant.format(database=url.database, role=role)))
    finally:
        engine.dispose()
    return url.set(username=role, password=password).render_as_string(hide_password=False)


@pytest.fixture
def viewer(pg_url):
    """A farm with a machine, a failed and a queued job, and a role that may only read it."""
    machine = prepare_farm(pg_url)
    return role_url(pg_url, READER_GRANTS), machine


def refusal(url: str) -> str:
    user = make_url(url).username
    return f"the database user '{user}' may only read: ask for a role with the GRANTs in docs/operations.md"


@pytest.mark.postgres
def test_a_reader_sees_the_farm_and_every_write_is_refused_in_one_line(viewer, pg_url):
    url, machine = viewer
    before = snapshot(pg_url)
    with Farm(url) as farm:
        assert farm.read_only
        assert farm.why_read_only == refusal(url)
        assert farm.status()["jobs"]["failed"] == 1
        assert [m["name"] for m in farm.status()["machines"]] == ["desk"]
        writes = [
            lambda: farm.enqueue_http("/x"),
            lambda: farm.retry(1),
            lambda: farm.cancel(2),
            lambda: farm.steer(str(machine), "pause"),
            lambda: farm.set_queue("default", limit=2),
        ]
        for write in writes:
            with pytest.raises(ReadOnly) as refused:
                write()
            assert str(refused.value) == refusal(url)
    assert snapshot(pg_url) == before


@pytest.mark.postgres
def test_the_cli_answers_a_readers_changes_in_one_line_and_still_shows_the_farm(viewer, pg_url, tmp_path):
    url, _machine = viewer
    before = snapshot(pg_url)
    for args in (["enqueue", "http", "/x"], ["retry", "1"], ["cancel", "2"], ["pause", "desk"], ["drain", "desk"]):
        ran = run_cli(["--db", url, *args], {}, tmp_path)
        assert (ran.returncode, ran.stdout, ran.stderr) == (1, "", f"error: {refusal(url)}\n"), args
    shown = run_cli(["--db", url, "status"], {}, tmp_path)
    assert shown.returncode == 0 and "desk" in shown.stdout, shown.stderr
    assert snapshot(pg_url) == before


@pytest.mark.postgres
def test_an_operator_with_the_documented_grants_may_change_the_farm(pg_url):
    prepare_farm(pg_url)
    with Farm(role_url(pg_url, OPERATOR_GRANTS)) as farm:
        assert not farm.read_only and farm.why_read_only is None
        [job] = farm.enqueue_http("/x")
        assert farm.job(job)["state"] == "queued"


@pytest.mark.postgres
def test_a_grant_taken_away_later_is_refused_in_the_same_line(pg_url):
    prepare_farm(pg_url)
    url = role_url(pg_url, OPERATOR_GRANTS)
    with Farm(url) as farm:
        assert not farm.read_only
        engine = open_engine(pg_url, pool_size=1)
        try:
            with engine.begin() as conn:
                conn.execute(text(f"REVOKE INSERT ON qp_jobs FROM {make_url(url).username}"))
        finally:
            engine.dispose()
        with pytest.raises(ReadOnly, match="may only read: ask for a role with the GRANTs"):
            farm.enqueue_http("/x")


def test_a_sqlite_file_opened_read_only_is_a_read_only_farm(tmp_path):
    path = tmp_path / "farm.db"
    with Farm(f"sqlite:///{path}") as farm:
        farm.enqueue_http("/x")
    url = f"sqlite:///file:{path}?mode=ro&uri=true"
    with Farm(url) as farm:
        assert farm.read_only and farm.why_read_only.startswith(f"{path} may only be read here")
        assert farm.status()["jobs"]["queued"] == 1
        with pytest.raises(ReadOnly):
            farm.enqueue_http("/y")
    ran = run_cli(["--db", url, "enqueue", "http", "/y"], {}, tmp_path)
    assert ran.returncode == 1 and ran.stderr.count("\n") == 1 and "may only be read here" in ran.stderr
    assert not (tmp_path / "file:").exists()  # the URI's path is the file's, not a folder named "file:"
