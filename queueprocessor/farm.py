"""The Python API: connect to a farm, enqueue work, look at it, steer its machines.

    from queueprocessor.farm import Farm
    farm = Farm("postgresql://qp:secret@db/farm")
    farm.enqueue_http("/reports/daily", delay=30)
    farm.enqueue_python("reports.jobs:daily", {"day": "2026-11-22"})
    farm.schedule("nightly", farm.command_spec(["backup", "--full"]), cron="0 3 * * *", tz="Europe/Berlin")
    with farm.lock("ledger"):
        ...
    print(farm.status()["machines"])

The CLI and the desktop app are thin layers over this class: every command they offer is a method here, so
the API has the same power, and neither of them reaches past it into the stores (an import-linter contract
in pyproject.toml holds them to that).
"""

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from sqlalchemy import exc

from . import grabs, singletons
from .bulkjobs import ManyJobs
from .farm_past import FarmPast
from .jobfunctions import JobFunction, target_of
from .node.config import FarmTiming, NodeConfig
from .rules.allow import check_allowed
from .rules.clock import Clock, SystemClock
from .rules.errors import (
    BadJobInput,
    DatabaseUnavailable,
    DuplicateKey,
    NotFound,
    QPError,
    echoed,
)
from .rules.job import JobSpec as JobSpec  # what work_spec returns: the app builds jobs from it
from .rules.job import to_json
from .rules.job import work_spec as work_spec  # the CLI, the app and scripts build jobs with it
from .rules.limits import LATEST, MAX_ATTEMPTS, MAX_WAIT
from .rules.queues import (
    DEFAULT,
    UNCHANGED,
    OnFailure,
    QueueInfo,
    Rate,
    check_limit,
    check_name,
    serving_machines,
)
from .rules.roster import Liveness, machine_status
from .rules.schedules import DEFAULT_GRACE, DEFAULT_MISFIRE, Recurrence
from .rules.search import JobFilter as JobFilter  # what find_jobs and act_on_jobs take
from .rules.states import SERVING
from .rules.urls import default_url, mask
from .schedulesteer import ScheduleSteering, within_reach
from .store import permissions
from .store.database import (
    APP_PROGRAM,
    check_schema,
    client_name,
    describe_failure,
    ensure_schema,
    open_engine,
    parse_url,
)
from .store.database import without_password as without_password  # the app's recent list keeps URLs so
from .store.events import actor_of
from .store.stores import Store
from .timing import SharedTiming
from .workflows import FarmFlows

if TYPE_CHECKING:  # loaded by the methods that return them, so that enqueueing never loads a node (cli.py)
    from .node.node import Node
    from .views import Dashboard


# -- what the app needs of a farm's URL and its failures, so that it imports neither the store nor SQLAlchemy --

DatabaseError = exc.SQLAlchemyError  # what a database that refuses a statement raises: the app reports it, goes on
# What a database that does not answer raises, as opposed to one that refuses what it is asked: worth a retry.
UNREACHABLE = (exc.OperationalError, exc.InterfaceError, exc.TimeoutError, DatabaseUnavailable, OSError)


def with_password(url: str, password: str = "") -> str:
    """The URL as the app connects to it: checked (ConfigError if malformed), with `password` if one is given."""
    parsed = parse_url(url)
    return (parsed.set(password=password) if password else parsed).render_as_string(hide_password=False)


def needs_password(url: str) -> bool:
    """A URL with a user and no password: how the app's recent list remembers a password-protected database."""
    parsed = parse_url(url)
    return bool(parsed.username) and parsed.password is None


def app_client(machine: str | None) -> str:
    """How the app labels its connections on the server (see Farm's `client`)."""
    return client_name(machine, APP_PROGRAM)


@dataclass(frozen=True)
class Enqueued:
    """What Farm.submit queued: the jobs' ids, and whether a live machine serves their queue."""

    ids: list[int]
    served: bool


class Farm(FarmFlows, ManyJobs, ScheduleSteering, FarmPast):
    def __init__(self, url: str | None = None, *, read_only: bool = False, client: str | None = None):
        """`read_only`: only look (the app's watch-only mode). Nothing is created or adopted, and the
        database itself refuses any write through this farm. A farm whose database user may only read is
        read-only too: `read_only` is then True and `why_read_only` says so in one line, and any write it is
        asked for raises that line as ReadOnly (store/permissions.py). `client` labels its connections on the
        server (default: database.client_name(), 'queueprocessor <host name>'; a node passes its machine name)."""
        self.url = url or default_url()
        self._engine = open_engine(self.url, read_only=read_only, client=client)
        try:
            access = None if read_only else permissions.check(self._engine)
            self.read_only = access is None or not access.may_write
            self.why_read_only = (
                None if not self.read_only else str(access.refusal()) if access else "opened only to watch the farm"
            )
            if self.read_only:
                check_schema(self._engine)
                self.created = False
            else:
                self.created = ensure_schema(self._engine)
        except QPError:
            self._engine.dispose()
            raise
        except exc.DBAPIError as error:
            self._engine.dispose()
            raise describe_failure(error, self.url) from None
        self._store = Store(self._engine)
        self._store.actor = actor_of(client)  # who the event log says changed the farm through us
        self._schedules = self._store.schedules
        self._queues = self._store.queues
        self._shared = SharedTiming(self._store, self.read_only)

    @property
    def masked_url(self) -> str:
        return mask(self.url)

    def close(self) -> None:
        self._store.give_back()  # a connection checked out when the pool is disposed of would be left open
        self._engine.dispose()

    def __enter__(self) -> "Farm":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- settings ---------------------------------------------------------

    def settings(self, **wanted: float | None) -> dict[str, float]:
        """The farm-wide timing settings. Values passed in are adopted by a new farm and must match an existing
        one."""
        return self._shared.adopt(**wanted)

    def current_settings(self) -> dict[str, float]:
        """The farm's settings as stored, defaults for any not stored yet; unlike settings(), never adopts them
        (so enqueueing into a new farm does not fix the timing its first node may choose)."""
        return self._shared.current()

    def liveness(self) -> Liveness:
        return self._shared.timing().liveness()

    def node(self, config: NodeConfig | None = None, *, clock: Clock | None = None, **settings: Any) -> "Node":
        """A node for this machine (start() it), with `config` (default: NodeConfig()) and `settings`, keywords
        that fill NodeConfig's fields: e.g. `queues="reports:2,default"` (at most 2 reports jobs at once here),
        `allow_modules=["myapp.jobs"]`. The farm-wide timing is the farm's; any asked for must be it, or a new
        farm adopts it. `clock`: in place of the system clock offset by `clock_skew`."""
        from .node.node import Node  # the engine and the node's threads: only a node loads them

        config = (config or NodeConfig()).given(**settings).checked()
        farm = self.settings(**{k: getattr(config, k) for k in config.asked})
        timing = FarmTiming.of(farm)
        config = replace(config, period=timing.period, heartbeat=timing.heartbeat, misses=timing.misses)
        return Node(self._store, config, clock=clock or SystemClock(config.clock_skew))

    # -- work -------------------------------------------------------------

    def enqueue_http(
        self,
        path: str,
        *,
        method: str = "GET",
        payload: str | None = None,
        delay: float = 0.0,
        at: float | None = None,
        priority: int = 0,
        max_attempts: int = MAX_ATTEMPTS,
        timeout: float | None = None,
        count: int = 1,
        key: str | None = None,
        queue: str = DEFAULT,
        order_key: str | None = None,
        after: Iterable[int] = (),
        after_ended: bool = False,
    ) -> list[int]:
        spec = work_spec(
            "http",
            path,
            method=method,
            payload=payload,
            priority=priority,
            max_attempts=max_attempts,
            timeout=timeout,
            key=key,
            queue=queue,
            order_key=order_key,
            after=after,
            after_ended=after_ended,
        )
        return self.enqueue(spec, delay=delay, at=at, count=count)

    def http_spec(self, path: str, **options: Any) -> JobSpec:
        """Work that calls `path` on a node's --http-base (or a URL on an allowed host); options as enqueue_http."""
        return work_spec("http", path, **{k: v for k, v in options.items() if v is not None})

    def python_spec(self, function: str | JobFunction, payload: object = None, **options: Any) -> JobSpec:
        """Work that calls `package.module:function` (or a @job function) with `payload`, any JSON-able value."""
        if isinstance(function, JobFunction):
            options = {**function.options, **{k: v for k, v in options.items() if v is not None}}
        target = function if isinstance(function, str) else target_of(function)
        return work_spec(
            "python", target, payload=to_json(payload), **{k: v for k, v in options.items() if v is not None}
        )

    def command_spec(self, argv: Iterable[str], payload: object = None, **options: Any) -> JobSpec:
        """Work that runs a program without a shell; `argv[0]` must be on the node's allow-list. `payload`
        (any JSON-able value) arrives on its stdin as JSON."""
        return work_spec(
            "command",
            json.dumps(list(argv)),
            payload=to_json(payload),
            **{k: v for k, v in options.items() if v is not None},
        )

    def enqueue_python(
        self,
        function: str | JobFunction,
        payload: object = None,
        *,
        delay: float = 0.0,
        at: float | None = None,
        count: int = 1,
        priority: int | None = None,
        max_attempts: int | None = None,
        timeout: float | None = None,
        key: str | None = None,
        queue: str | None = None,
        order_key: str | None = None,
        after: Iterable[int] = (),
        after_ended: bool = False,
    ) -> list[int]:
        spec = self.python_spec(
            function,
            payload,
            priority=priority,
            max_attempts=max_attempts,
            timeout=timeout,
            key=key,
            queue=queue,
            order_key=order_key,
            after=after or None,
            after_ended=after_ended or None,
        )
        return self.enqueue(spec, delay=delay, at=at, count=count)

    def enqueue_command(
        self,
        argv: Iterable[str],
        payload: object = None,
        *,
        delay: float = 0.0,
        at: float | None = None,
        count: int = 1,
        **options: Any,
    ) -> list[int]:
        return self.enqueue(self.command_spec(argv, payload, **options), delay=delay, at=at, count=count)

    def enqueue(self, spec: JobSpec, *, delay: float = 0.0, at: float | None = None, count: int = 1) -> list[int]:
        """Queue `count` copies of `spec`. A key already taken raises grabs.AlreadyTaken naming the winner."""
        return self.submit(spec, delay=delay, at=at, count=count).ids

    def submit(self, spec: JobSpec, *, delay: float = 0.0, at: float | None = None, count: int = 1) -> Enqueued:
        """As enqueue, and say whether a live machine serves the jobs' queue (if none does, they wait until one
        does), from the same read of the machine rows as the allow-list check."""
        if count < 1:
            raise BadJobInput.out_of("count", count, "at least 1")
        if not 0 <= delay <= MAX_WAIT:
            raise BadJobInput.out_of("delay", delay, f"from 0 to {MAX_WAIT:.0f} seconds, ten years")
        if at is not None and not 0 <= at <= LATEST:
            raise BadJobInput.out_of(
                "at",
                at,
                f"a time from 1970 to 9999, e.g. 2026-11-22T18:00:00+00:00 or epoch seconds up to {LATEST:.0f}",
            )
        live = self._live_allowing(spec)
        try:
            ids = self._store.jobs.enqueue(self._signed(spec), delay=delay, at=at, count=count)
        except DuplicateKey as error:
            raise grabs.refuse(self._store, error) from None
        return Enqueued(ids, bool(serving_machines(live, spec.queue)))

    def check_allowed(self, spec: JobSpec) -> None:
        """Refuse, with the reason, work that no live machine's allow-lists would let it run."""
        self._live_allowing(spec)

    def _live_allowing(self, spec: JobSpec) -> list[dict[str, Any]]:
        """check_allowed, and the live machines' rows it read."""
        live = self._live_machines()
        check_allowed(spec, [m["allow"] for m in live if m["allow"]])
        return live

    @staticmethod
    def _signed(spec: JobSpec) -> JobSpec:
        return spec if spec.origin else replace(spec, origin=grabs.origin())

    def grab(self, key: str, instance: str, spec: JobSpec) -> int:
        """Enqueue `spec` as the one job for `key` + `instance`. Returns its id, or raises
        grabs.AlreadyTaken saying who won and whether it finished (wait for it with `wait`)."""
        return self.enqueue(replace(spec, key=grabs.grab_key(key, instance)))[0]

    def job(self, job_id: int) -> dict[str, Any]:
        """A job's row, the jobs it runs `after`, and its runs (every attempt: machine, fence, times, outcome...)."""
        record = self._store.jobs.get(job_id)
        record["after"] = self._store.flows.parents(job_id)
        record["runs"] = self._store.runs.read(job_id=job_id)
        return record

    def wait(self, job_id: int, timeout: float | None = None) -> dict[str, Any]:
        """Wait until a job has finished (succeeded, failed for good or cancelled); return it with its runs."""
        grabs.wait(self._store, job_id, timeout)
        return self.job(job_id)

    def wait_grab(self, job_id: int, timeout: float | None = None) -> grabs.Holder:
        """wait() for a grabbed job, answered as its holder: where it ran, how it ended, its last output."""
        return grabs.wait(self._store, job_id, timeout)

    def list_jobs(self, state: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """The newest `limit` jobs (in `state`, if given), newest first."""
        return self._store.jobs.newest(state, limit)

    def job_counts(self) -> dict[str, int]:
        """How many jobs are in each state (every state named, 0 where none)."""
        return self._store.jobs.counts()

    def cancel(self, job_id: int) -> str:
        """Cancel a queued job at once ("cancelled"); ask the owner of a running one to stop it within a
        heartbeat ("cancelling")."""
        return self._store.jobs.cancel(job_id)

    def retry(self, job_id: int) -> str:
        """Put a failed or cancelled job back in the queue for one more attempt ("queued"), or back to wait for
        its parents ("waiting")."""
        return self._store.jobs.retry(job_id)

    # -- schedules, singletons, locks --------------------------------------

    def _ahead(self) -> dict[str, Any]:
        timing = self._shared.timing()
        return dict(ahead=timing.schedule_ahead, period=timing.period)

    def schedule(
        self,
        name: str,
        spec: JobSpec,
        *,
        cron: str | None = None,
        tz: str | None = None,
        every: float | None = None,
        misfire: str = DEFAULT_MISFIRE,
        grace: float = DEFAULT_GRACE,
    ) -> dict[str, Any]:
        """Run `spec` at every occurrence of a cron expression (in time zone `tz`) or every N seconds."""
        recurrence = within_reach(Recurrence.parse(cron, tz, every))
        self.check_allowed(spec)
        return self._schedules.add(name, recurrence, self._signed(spec), misfire=misfire, grace=grace, **self._ahead())

    def singleton(self, name: str, spec: JobSpec) -> int:
        """Keep `spec` running on exactly one live machine; returns its job id."""
        self.check_allowed(spec)
        return singletons.add(self._store, name, self._signed(spec))

    def list_singletons(self) -> list[dict[str, Any]]:
        """Every singleton (its job's row and `name`), by name."""
        return singletons.list_all(self._store)

    def remove_singleton(self, name: str) -> str:
        """Stop a singleton for good: "cancelled" at once if it waits, "cancelling" (within a heartbeat) if it runs."""
        return singletons.remove(self._store, name)

    def lock(self, name: str, wait: float | None = None) -> singletons.Lock:
        """A distributed lock: `with farm.lock("name") as lock:` (lock.fence, lock.lost). `wait`: seconds
        to wait for it (None: for ever), then singletons.LockHeld."""
        timing = self._shared.timing()
        return singletons.Lock(self._store, name, lease=timing.lease, renew_every=timing.heartbeat, wait=wait)

    # -- queues -----------------------------------------------------------

    def queues(self) -> list[QueueInfo]:
        """Every queue with work, settings or a machine serving it by name (and `default`), by name."""
        return self._queues.infos(self._live_machines())

    def queue(self, name: str) -> QueueInfo:
        """One queue, as queues() shows it (NotFound for a name no job, setting or machine has used but
        `default`'s), its settings and counts read alone."""
        known = name if name == DEFAULT else self._known_queue(name)
        return self._queues.infos(self._live_machines(), only=known)[0]

    def serving(self, queue: str) -> tuple[str, ...]:
        """The names of the live machines that serve `queue` (none: its jobs wait until one joins)."""
        return serving_machines(self._live_machines(), queue)

    def pause_queue(self, name: str) -> None:
        """Start nothing more of queue `name`, farm-wide, from the next claim on; running jobs finish."""
        self._queues.put(self._known_queue(name), paused=True)

    def resume_queue(self, name: str) -> None:
        self._queues.put(self._known_queue(name), paused=False)

    def set_queue(
        self, name: str, *, limit: object = UNCHANGED, rate: object = UNCHANGED, on_failure: object = UNCHANGED
    ) -> None:
        """Change a queue's farm-wide settings: `limit` (most jobs running at once; None: no limit), `rate`
        (a Rate or "10/s"; None: no rate) and `on_failure` (OnFailure, for its order keys). Others stay."""
        values: dict[str, object] = {}
        if limit is not UNCHANGED:
            values["max_running"] = check_limit(limit)
        if rate is not UNCHANGED:
            parsed = None if rate is None else Rate.parse(rate)
            burst = None if parsed is None else parsed.burst(self.current_settings()["period"])
            values |= dict(
                rate_count=None if parsed is None else parsed.count,
                rate_per=None if parsed is None else parsed.per_seconds,
                burst=burst,
                tokens=None,
                refilled_at=None,
            )
        if on_failure is not UNCHANGED:
            values["on_failure"] = OnFailure.parse(on_failure)
        self._queues.put(self._known_queue(name), **values)

    def _known_queue(self, name: str) -> str:
        if not self._queues.known(check_name(name)):
            raise NotFound(
                f"no queue named {echoed(name)}: a queue exists once a job is enqueued to it or a machine "
                "serves it by name",
                what="queue",
                ref=name,
            )
        return name

    def _live_machines(self) -> list[dict[str, Any]]:
        """The machine rows that still take work (active or paused, not dead)."""
        now, _, rows = self._store.machines.read()
        liveness = self.liveness()
        return [m for m in rows if machine_status(m, now, liveness) in SERVING]

    # -- looking ----------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """Machines with their judged state and clock sync, job counts, and the database's time."""
        liveness = self.liveness()
        now, _, rows = self._store.machines.read()
        for row in rows:
            row["status"] = machine_status(row, now, liveness)
        return {
            "db_now": now,
            "database": self.masked_url,
            "settings": self.current_settings(),
            "machines": rows,
            "jobs": self._store.jobs.counts(),
        }

    def turns(self, seconds: float = 60.0) -> list[dict[str, Any]]:
        """The turn log of the last `seconds` of database time: which machine took which slot."""
        return self._store.turns.read(self._store.ask_time() - seconds)

    def dashboard(self, clock: Callable[[], float] = time.monotonic) -> "Dashboard":
        """What a dashboard reads at each poll (views.Dashboard.read), for this farm's timing."""
        from .views import Dashboard  # the app's reading: not the CLI's

        return Dashboard(self._store, FarmTiming.of(self.settings()), clock)

    def steer(self, machine: str, wish: str) -> dict[str, Any]:
        """Ask a machine (by name or id) to pause, resume or drain."""
        row = self._store.machines.find(machine)
        self._store.machines.wish(row["id"], wish)
        return row
