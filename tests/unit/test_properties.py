"""Property-based tests (hypothesis) for what people and machines feed the parsers, and for the pure
functions every node must agree on.

Parsers: any text at all is either accepted (and then means what it says) or refused with one clear line,
never another exception; a password is never shown. Scheduling: the roster, slots and turns, liveness,
the clock estimate and schedule plans keep their promises for every input, not just the examples.
"""

import json
import math
import re
from datetime import datetime
from urllib.parse import quote_plus

import click
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import URL

from queueprocessor.cli.work import _parse_time
from queueprocessor.rules.clock import FakeClock, OffsetEstimator, SystemClock
from queueprocessor.rules.errors import ConfigError, InvalidJob
from queueprocessor.rules.job import parse_payload
from queueprocessor.rules.limits import MAX_PAYLOAD
from queueprocessor.rules.output import format_time
from queueprocessor.rules.roster import (
    Liveness,
    machine_status,
    next_turn,
    roster,
    slot_of,
    slot_owner,
    slot_start,
)
from queueprocessor.rules.schedules import MAX_PER_PASS, MIN_EVERY, Recurrence, plan
from queueprocessor.store.database import mask, parse_url, without_password

PROPERTY = settings(deadline=None, database=None, max_examples=200)
SLOW = settings(deadline=None, database=None, max_examples=40)


def one_line(error: Exception) -> bool:
    return bool(str(error)) and "\n" not in str(error)


# -- job payloads --------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=20,
)


@PROPERTY
@given(json_values, st.sampled_from([None, 2]), st.booleans())
def test_any_json_payload_is_kept_as_the_same_value(value, indent, ascii_only):
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    assume(len(text.encode()) <= MAX_PAYLOAD)
    stored = parse_payload(text)
    assert json.loads(stored) == value
    assert parse_payload(stored) == stored  # stored in one canonical form


@PROPERTY
@given(st.text())
@example("NaN")
@example("[" * 50_000)
@example("\udcff")
@example('{"a": Infinity}')
def test_any_text_is_a_payload_or_one_clear_error(text):
    try:
        stored = parse_payload(text)
    except InvalidJob as error:
        assert one_line(error)
        return
    assert stored is None or json.loads(stored, parse_constant=pytest.fail) is not ...


@PROPERTY
@given(st.integers(min_value=-64, max_value=64))
def test_payloads_up_to_the_limit_are_accepted_and_larger_ones_refused(around):
    size = MAX_PAYLOAD + around
    text = json.dumps("x" * (size - 2))  # the quotes make up the rest
    if size <= MAX_PAYLOAD:
        assert parse_payload(text) == text
    else:
        with pytest.raises(InvalidJob, match=f"payload is {size} bytes, over the {MAX_PAYLOAD} byte limit"):
            parse_payload(text)


# -- database URLs and the password mask -----------------------------------------

# Anything at all, ending in a mark no message of ours contains (so "sqli" is not found in "use sqlite").
secrets = st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=30).map(lambda s: s + "Zq9")
users = st.text("abcdefghijklmnopqrstuvwxyz0123456789_.-", min_size=1, max_size=12)
hosts = st.sampled_from(["db.example", "127.0.0.1", "db-3.farm.internal:5433"])
names = st.text("abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=12)


@PROPERTY
@given(st.text())
@example("postgresql://u:p@ss@db.example/farm")
@example("postgresql://u:pw@db.example:notaport/farm")
@example("://")
def test_any_text_is_a_database_url_or_one_clear_error(text):
    try:
        url = parse_url(text)
    except ConfigError as error:
        assert one_line(error)
        return
    assert url.get_backend_name() in ("sqlite", "postgresql", "mssql")


def assert_parsed_url_hides(password: str, text: str) -> None:
    """Parsed, the URL shows no password masked; refused, its error shows none either."""
    try:
        url = parse_url(text)
    except ConfigError as error:
        assert password not in str(error)
        return
    assert password not in mask(url)


@PROPERTY
@given(users, secrets, hosts, names, st.sampled_from(["postgresql", "postgresql+psycopg", "mssql", "mysql"]))
@example("qp", "my secret", "db.example", "farm", "postgresql")
@example("qp", "p@ss/w:rd", "db.example", "farm", "postgresql")
def test_a_password_typed_as_is_never_shown(user, password, host, name, scheme):
    text = f"{scheme}://{user}:{password}@{host}/{name}"
    assume(password not in f"{scheme}://{user}:***@{host}/{name}")
    assert password not in mask(text)
    assert_parsed_url_hides(password, text)


@PROPERTY
@given(users, secrets, hosts, names)
def test_a_password_written_encoded_is_never_shown(user, password, host, name):
    host, _, port = host.partition(":")
    url = URL.create("postgresql", user, password, host, int(port) if port else None, name)
    text = url.render_as_string(hide_password=False)
    encoded = text.split("://", 1)[1].rsplit("@", 1)[0].split(":", 1)[1]
    assume(encoded not in mask(url))
    assert parse_url(text).password == password
    assert encoded not in mask(text) and password not in mask(text)
    assert encoded not in mask(parse_url(text))


# "password" or "pwd" in any mix of cases, as a query string or an ODBC connection string may spell it.
password_keys = st.sampled_from(["password", "pwd"]).flatmap(
    lambda key: st.tuples(*(st.sampled_from([c, c.upper()]) for c in key)).map("".join)
)


@PROPERTY
@given(users, secrets, hosts, names, password_keys)
@example("qp", "S3crZq9", "db.example", "x", "password")
@example("0", ";Zq9", "db.example", "0", "pwd")  # an encoded ";" (%3B) is the password's own, not its end
def test_a_password_in_the_query_string_is_never_shown_nor_remembered(user, password, host, name, key):
    text = f"postgresql://{user}@{host}/{name}?sslmode=prefer&{key}={quote_plus(password)}"
    for shown in (mask(text), mask(parse_url(text)), without_password(text)):
        assert password not in shown and quote_plus(password) not in shown
    assert "sslmode=prefer" in without_password(text)


@PROPERTY
@given(users, secrets.filter(lambda s: "}" not in s), hosts, password_keys, st.booleans())
@example("qp", "S3crZq9", "db.example", "PWD", False)
@example("qp", "a;b=cZq9", "db.example", "Pwd", True)
def test_a_password_in_an_odbc_connection_string_is_never_shown_nor_remembered(user, password, host, key, braced):
    value = f"{{{password}}}" if braced or ";" in password or password[0] == "{" else password  # ODBC's quoting
    odbc = f"DRIVER={{ODBC Driver 18 for SQL Server}};SERVER={host};UID={user};{key}={value};Encrypt=yes"
    text = "mssql+pyodbc:///?odbc_connect=" + quote_plus(odbc)
    for shown in (mask(odbc), mask(text), mask(parse_url(text)), without_password(text)):
        assert password not in shown and quote_plus(password) not in shown
    assert "Encrypt%3Dyes" in without_password(text)


@PROPERTY
@given(
    users,
    secrets.filter(lambda s: not s[0].isspace() and not s.startswith("//")),
    hosts,
    names,
    st.sampled_from(["postgresql//", "postgresql:/", "", "postgresql:", "mssql+pyodbc:"]),
)
@example("qp", "Sup3rS3cret", "localhost", "farm", "postgresql//")
@example("qp", "pw", "h", "f", "postgresql:/")
@example("qp", "Sup3rS3cret", "host", "farm", "")
def test_a_password_in_a_url_that_does_not_parse_is_never_shown(user, password, host, name, scheme):
    text = f"{scheme}{user}:{password}@{host}/{name}"
    assert password not in mask(text) and password not in mask(f"error: bad URL {text!r}")
    assert mask(text).endswith(f":***@{host}/{name}")  # only the password hidden
    assert_parsed_url_hides(password, text)


@PROPERTY
@given(st.text())
def test_masking_twice_is_masking_once(text):
    assert mask(mask(text)) == mask(text)


@PROPERTY
@given(users, hosts, names)
def test_urls_without_a_password_are_shown_as_they_are(user, host, name):
    for text in (f"postgresql://{user}@{host}/{name}", f"postgresql://{host}/{name}", f"sqlite:///{name}/farm.db"):
        assert mask(text) == text


# -- times typed at the command line -----------------------------------------------


@PROPERTY
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_epoch_seconds_mean_exactly_that_instant(seconds):
    assert _parse_time(repr(seconds), "--at") == seconds


@PROPERTY
@given(st.datetimes(timezones=st.timezones()))
def test_an_iso_time_with_its_zone_means_that_instant(when):
    assert _parse_time(when.isoformat(), "--at") == pytest.approx(when.timestamp(), abs=1e-6)


@PROPERTY
@given(st.text())
@example("tomorrow")
@example("2026-13-45T00:00:00")
def test_any_text_is_a_time_or_one_clear_error(text):
    try:
        value = _parse_time(text, "--at")
    except click.BadParameter as error:
        assert one_line(error) and "--at" in error.format_message()
        return
    assert isinstance(value, float)


@PROPERTY
@given(st.floats() | st.integers(min_value=-(10**30), max_value=10**30))
@example(1e300)
@example(1e15)
@example(-1e13)
@example(-30_610_224_001)  # the year 999: strftime wrote "999-12-31"
def test_any_stored_time_is_shown_as_a_date_or_as_its_epoch_seconds(epoch):
    shown = format_time(epoch)
    if math.isnan(epoch):
        assert shown == "-"
    elif not re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}", shown):
        assert float(shown) == pytest.approx(epoch, rel=1e-5)


def test_a_time_without_a_zone_is_local_time():
    assert _parse_time("2026-11-22T18:00:00", "--at") == datetime(2026, 11, 22, 18, 0).timestamp()


# -- roster, slots and turns -----------------------------------------------------

NOW = 1_800_000_000.0
STATES = ["active", "paused", "draining", "stopped"]


@st.composite
def machine_rows(draw):
    ids = draw(st.lists(st.integers(1, 10_000), unique=True, max_size=12))
    return [
        {
            "id": i,
            "state": draw(st.sampled_from(STATES)),
            "last_seen": NOW - draw(st.floats(0, 20)),
            "joined_at": NOW - draw(st.floats(0, 60)),
        }
        for i in ids
    ]


@PROPERTY
@given(machine_rows(), st.floats(0.1, 10), st.floats(0, 5), st.randoms())
def test_the_roster_is_every_active_live_settled_machine_in_id_order(rows, dead_after, join_delay, rng):
    liveness = Liveness(dead_after)
    ids = roster(rows, NOW, liveness, join_delay)
    expected = sorted(
        m["id"]
        for m in rows
        if m["state"] == "active" and NOW - m["last_seen"] <= dead_after and NOW - m["joined_at"] >= join_delay
    )
    assert ids == expected
    shuffled = list(rows)
    rng.shuffle(shuffled)
    assert roster(shuffled, NOW, liveness, join_delay) == ids  # every node reads rows in its own order


rosters = st.lists(st.integers(1, 10_000), unique=True, min_size=1, max_size=16).map(sorted)


@PROPERTY
@given(rosters, st.integers(-(10**12), 10**12))
def test_every_machine_owns_exactly_one_slot_in_each_round(ids, first):
    owners = [slot_owner(ids, slot) for slot in range(first, first + len(ids))]
    assert sorted(owners) == ids


@PROPERTY
@given(rosters, st.data(), st.floats(NOW - 1e6, NOW + 1e6), st.sampled_from([0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.7]))
def test_next_turn_is_my_first_slot_from_now(ids, data, now, period):
    me = data.draw(st.sampled_from(ids))
    turn = next_turn(ids, me, now, period)
    current = slot_of(now, period)
    assert current <= turn < current + len(ids)
    assert slot_owner(ids, turn) == me
    assert all(slot_owner(ids, s) != me for s in range(current, turn))
    assert next_turn([i for i in ids if i != me], me, now, period) is None


@PROPERTY
@given(st.integers(-(10**9), 10**9), st.floats(0.001, 1000))
def test_the_middle_of_a_slot_is_in_that_slot(slot, period):
    assert slot_of(slot_start(slot, period) + period / 2, period) == slot


@PROPERTY
@given(st.floats(-1e9, 1e9), st.floats(-1e9, 1e9), st.floats(0.001, 1000))
def test_slots_never_go_backwards_in_time(a, b, period):
    early, late = sorted((a, b))
    assert slot_of(early, period) <= slot_of(late, period)


@PROPERTY
@given(st.floats(0.1, 100), st.floats(0, 1e6), st.floats(0, 1e6), st.floats(0, 1e6), st.floats(0, 1e6))
def test_a_judge_only_counts_silence_during_its_own_unbroken_check_ins(dead_after, seen, streak, now, later):
    early, late = sorted((streak, streak + later))
    if Liveness(dead_after, late).is_dead(seen, now):  # a later streak start never kills anyone more
        assert Liveness(dead_after, early).is_dead(seen, now)
    if Liveness(dead_after, streak).is_dead(seen, now):  # dead stays dead as time goes on
        assert Liveness(dead_after, streak).is_dead(seen, now + later)
    if now <= streak + dead_after:  # just back from a stall: nobody is dead yet
        assert not Liveness(dead_after, streak).is_dead(seen, now)


@PROPERTY
@given(machine_rows(), st.floats(0.1, 10), st.floats(NOW - 30, NOW))
def test_a_stopped_machine_is_stopped_and_any_other_is_dead_only_when_silent(rows, dead_after, streak):
    liveness = Liveness(dead_after, streak)
    for row in rows:
        status = machine_status(row, NOW, liveness)
        if row["state"] == "stopped":
            assert status == "stopped"
        else:
            assert status == ("dead" if liveness.is_dead(row["last_seen"], NOW) else row["state"])


# -- the clock estimate ----------------------------------------------------------

samples = st.lists(st.tuples(st.floats(0, 0.5), st.floats(0, 0.5), st.floats(0, 30)), min_size=1, max_size=16)


@PROPERTY
@given(st.floats(-1e6, 1e6), samples, st.floats(-1e5, 1e5))
def test_the_database_clock_is_within_the_error_bound_however_the_delays_fall(offset, trips, step):
    """Cristian's bound: with any one-way delays, the truth lies within rtt/2 (plus drift) of the estimate.
    A step of the wall clock moves the published offset, never the estimate."""
    clock = FakeClock()
    estimator = OffsetEstimator(clock)

    def ask(up, down):
        clock.advance(up)
        db = clock.monotonic() + offset
        clock.advance(down)
        return db

    for up, down, pause in trips:
        estimator.measure(lambda up=up, down=down: ask(up, down))
        clock.advance(pause)
    truth = clock.monotonic() + offset
    tolerance = 1e-9 * max(1.0, abs(truth))
    assert abs(estimator.db_now() - truth) <= estimator.error_bound() + tolerance
    best = estimator.best()

    def age(s):
        return clock.monotonic() - s.t1

    assert all(
        best.rtt / 2 + estimator.DRIFT * age(best) <= s.rtt / 2 + estimator.DRIFT * age(s) + tolerance
        for s in estimator._samples
    )
    before, published = estimator.db_now(), estimator.offset()
    clock.wall_offset += step
    assert estimator.db_now() == before
    assert estimator.offset() == pytest.approx(published - step, abs=tolerance + 1e-6)


@PROPERTY
@given(st.floats(-1e6, 1e6))
def test_stepping_the_system_wall_clock_leaves_database_time_alone(step):
    clock = SystemClock()
    estimator = OffsetEstimator(clock)
    estimator.measure(lambda: clock.time() + 12.5)
    before = estimator.db_now()
    clock.step(step)
    assert 0 <= estimator.db_now() - before < 1.0


@PROPERTY
@given(st.floats(max_value=-1e-12, allow_nan=False, allow_infinity=False) | st.floats(min_value=0, max_value=1e6))
def test_the_fake_clock_never_goes_backwards(seconds):
    clock = FakeClock()
    start = clock.monotonic()
    if seconds < 0:
        with pytest.raises(ValueError):
            clock.advance(seconds)
        assert clock.monotonic() == start
    else:
        clock.advance(seconds)
        assert clock.monotonic() == start + seconds


# -- schedules -------------------------------------------------------------------

cron_field = st.one_of(
    st.just("*"),
    st.integers(0, 70).map(str),
    st.integers(0, 70).map(lambda n: f"*/{n}"),
    st.tuples(st.integers(0, 70), st.integers(0, 70)).map(lambda ab: f"{ab[0]}-{ab[1]}"),
    st.lists(st.integers(0, 70), min_size=2, max_size=3).map(lambda v: ",".join(map(str, v))),
)
crons = st.lists(cron_field, min_size=5, max_size=6).map(" ".join)


@SLOW
@given(st.text(max_size=40) | crons, st.sampled_from([None, "UTC", "Europe/Berlin", "America/St_Johns", "Nowhere/x"]))
@example("0 0 31 2 *", None)
@example("*/0 * * * *", None)
@example("99999999999999999999 * * * *", None)
def test_any_cron_text_is_a_schedule_or_one_clear_error(text, tz):
    try:
        recurrence = Recurrence.parse(cron=text, tz=tz)
    except InvalidJob as error:
        assert one_line(error)
        return
    t = NOW
    for _ in range(3):
        following = recurrence.after(t)
        assert following > t
        t = following


@PROPERTY
@given(st.floats(allow_nan=True, allow_infinity=True))
def test_an_interval_is_at_least_the_minimum_and_finite(every):
    if math.isfinite(every) and every >= MIN_EVERY:
        assert Recurrence.parse(every=every).every == every
    else:
        with pytest.raises(InvalidJob):
            Recurrence.parse(every=every)


@PROPERTY
@given(st.floats(MIN_EVERY, 1e5), st.floats(-1e9, 1e9))
def test_an_interval_recurs_at_the_next_whole_multiple(every, t):
    following = Recurrence(every=every).after(t)
    assert t < following <= t + every * (1 + 1e-9) + 1e-6
    assert following / every == pytest.approx(round(following / every), abs=1e-6)


@PROPERTY
@given(
    st.floats(1, 3600),
    st.floats(0, 1e5),
    st.floats(0, 1e5),
    st.floats(0, 100),
    st.floats(0.1, 5),
    st.sampled_from(["skip", "once", "all"]),
    st.floats(0, 1e5),
    st.floats(0, 1e4),
)
def test_turns_make_each_occurrence_at_most_once_and_in_order(
    every, behind, later, ahead, period, misfire, grace, more
):
    recurrence = Recurrence(every=every)
    now = NOW + later
    first = plan(
        recurrence, recurrence.after(now - behind), now, ahead=ahead, period=period, misfire=misfire, grace=grace
    )
    second = plan(recurrence, first.next_run, now + more, ahead=ahead, period=period, misfire=misfire, grace=grace)
    for p, at in ((first, now), (second, now + more)):
        assert p.occurrences == sorted(set(p.occurrences))
        assert len(p.occurrences) <= MAX_PER_PASS
        assert all(at - grace - every <= o <= at + ahead for o in p.occurrences)
        assert all(p.next_run > o for o in p.occurrences)
        missed = [o for o in p.occurrences if at - o > period]
        assert len(missed) <= {"skip": 0, "once": 1, "all": MAX_PER_PASS}[misfire]
    assert not set(first.occurrences) & set(second.occurrences)
