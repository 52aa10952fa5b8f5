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

import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Unpack

from sqlalchemy import exc

from . import bulkjobs, farm_past, grabs, jobs, singletons
from .jobfunctions import JobFunction
from .jobs import Enqueued
from .machines import Machines
from .node.config import FarmTiming, NodeConfig
from .queues import Queues
from .rules.clock import Clock
from .rules.errors import DatabaseUnavailable, QPError
from .rules.fairness import KeyUse
from .rules.job import JobOptions, JobSpec
from .rules.queue_settings import QueueSettings
from .rules.queues import QueueInfo
from .rules.roster import Liveness
from .rules.schedules import DEFAULT_GRACE, DEFAULT_MISFIRE, Recurrence
from .rules.search import BulkAction, JobFilter
from .rules.urls import default_url, mask
from .schedulesteer import ScheduleChanges, ScheduleSteering
from .store import permissions
from .store.bulk import Changed
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
from .timing import SharedTiming, node_for
from .workflows import Flows, Workflow

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


class Farm:
    """One farm, reached through its database: every method is a short delegation to the feature module that
    does it (jobs, bulkjobs, workflows, schedulesteer, singletons, grabs, queues, machines, farm_past, timing),
    each given what it needs (the store, the farm's timing, the live machines); docs/api.md lists them all."""

    # -- connecting ---------------------------------------------------------

    def __init__(self, url: str | None = None, *, read_only: bool = False, client: str | None = None):
        """Connect to the farm at `url` (default: the SQLite file in the data folder), making or upgrading its
        schema. `read_only`: only look (the app's watch-only mode); nothing is created or adopted, and the
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
        self._shared = SharedTiming(self._store, self.read_only)
        self._machines = Machines(self._store, self.liveness)
        self._queues = Queues(self._store, self._machines, self._shared)
        self._schedules = ScheduleSteering(self._store, self._shared, self._machines)
        self._flows = Flows(self._store, self._machines)

    @property
    def masked_url(self) -> str:
        """The farm's URL with its password as `***`."""
        return mask(self.url)

    def close(self) -> None:
        """Give the farm's connections back to the server."""
        self._store.give_back()  # a connection checked out when the pool is disposed of would be left open
        self._engine.dispose()

    def __enter__(self) -> "Farm":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- settings and nodes -------------------------------------------------

    def settings(self, **wanted: float | None) -> dict[str, float]:
        """The farm-wide timing settings: values given are adopted by a new farm and must match an existing one."""
        return self._shared.adopt(**wanted)

    def current_settings(self) -> dict[str, float]:
        """The farm's settings as stored, defaults for any not stored yet; unlike settings(), never adopts them
        (so enqueueing into a new farm does not fix the timing its first node may choose)."""
        return self._shared.current()

    def liveness(self) -> Liveness:
        """How long a machine may go unheard before it is judged dead, from the farm's timing."""
        return self._shared.timing().liveness()

    def node(self, config: NodeConfig | None = None, *, clock: Clock | None = None, **settings: Any) -> "Node":
        """A node for this machine (start() it), with `config` (default: NodeConfig()) and `settings`, keywords
        that fill NodeConfig's fields: e.g. `queues="reports:2,default"` (at most 2 reports jobs at once here),
        `allow_modules=["myapp.jobs"]`. The farm-wide timing is the farm's; any asked for must be it, or a new
        farm adopts it. `clock`: in place of the system clock offset by `clock_skew`."""
        return node_for(self._store, self._shared, config or NodeConfig(), clock, settings)

    # -- work ---------------------------------------------------------------

    def http_spec(self, path: str, *, payload: str | None = None, **options: Unpack[JobOptions]) -> JobSpec:
        """Work that calls `path` on a node's --http-base (or a URL on an allowed host); `payload` is JSON text."""
        return jobs.http_spec(path, payload=payload, **options)

    def python_spec(
        self, function: str | JobFunction, payload: object = None, **options: Unpack[JobOptions]
    ) -> JobSpec:
        """Work that calls `package.module:function` (or a @job function) with `payload`, any JSON-able value."""
        return jobs.python_spec(function, payload, **options)

    def command_spec(self, argv: Iterable[str], payload: object = None, **options: Unpack[JobOptions]) -> JobSpec:
        """Work that runs a program without a shell; `argv[0]` must be on the node's allow-list. `payload`
        (any JSON-able value) arrives on its stdin as JSON."""
        return jobs.command_spec(argv, payload, **options)

    def enqueue_http(
        self,
        path: str,
        *,
        payload: str | None = None,
        delay: float = 0.0,
        at: float | None = None,
        count: int = 1,
        **options: Unpack[JobOptions],
    ) -> list[int]:
        """Queue `count` calls of `path` (http_spec), due after `delay` seconds or at epoch time `at`."""
        return self.enqueue(self.http_spec(path, payload=payload, **options), delay=delay, at=at, count=count)

    def enqueue_python(
        self,
        function: str | JobFunction,
        payload: object = None,
        *,
        delay: float = 0.0,
        at: float | None = None,
        count: int = 1,
        **options: Unpack[JobOptions],
    ) -> list[int]:
        """Queue `count` calls of a Python function (python_spec), due after `delay` seconds or at time `at`."""
        return self.enqueue(self.python_spec(function, payload, **options), delay=delay, at=at, count=count)

    def enqueue_command(
        self,
        argv: Iterable[str],
        payload: object = None,
        *,
        delay: float = 0.0,
        at: float | None = None,
        count: int = 1,
        **options: Unpack[JobOptions],
    ) -> list[int]:
        """Queue `count` runs of a program (command_spec), due after `delay` seconds or at time `at`."""
        return self.enqueue(self.command_spec(argv, payload, **options), delay=delay, at=at, count=count)

    def enqueue(self, spec: JobSpec, *, delay: float = 0.0, at: float | None = None, count: int = 1) -> list[int]:
        """Queue `count` copies of `spec`. A key another job holds raises grabs.AlreadyTaken naming the holder,
        unless `spec`'s on_conflict or debounce says otherwise (rules/keys.py): then the holder's id."""
        return self.submit(spec, delay=delay, at=at, count=count).ids

    def submit(self, spec: JobSpec, *, delay: float = 0.0, at: float | None = None, count: int = 1) -> Enqueued:
        """As enqueue, and say whether a live machine serves the jobs' queue (if none does, they wait until one
        does), from the same read of the machine rows as the allow-list check."""
        return jobs.submit(self._store, self._machines, spec, delay=delay, at=at, count=count)

    def check_allowed(self, spec: JobSpec) -> None:
        """Refuse, with the reason, work that no live machine's allow-lists would let it run."""
        self._machines.allowing(spec)

    # -- looking at jobs ----------------------------------------------------

    def job(self, job_id: int) -> dict[str, Any]:
        """A job's row, the jobs it runs `after`, and its runs (every attempt: machine, fence, times, outcome...)."""
        return jobs.read(self._store, job_id)

    def wait(self, job_id: int, timeout: float | None = None) -> dict[str, Any]:
        """Wait until a job has finished (succeeded, failed for good or cancelled); return it with its runs."""
        grabs.wait(self._store, job_id, timeout)
        return self.job(job_id)

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

    # -- many jobs at once --------------------------------------------------

    def find_jobs(self, where: JobFilter, limit: int = 100) -> list[dict[str, Any]]:
        """The newest `limit` jobs that `where` picks (its search: rules/search.py), newest first."""
        return self._store.views.filtered_jobs(where, limit)

    def count_jobs(self, action: str, where: JobFilter) -> int:
        """How many jobs `action` ("retry", "cancel", "delete") would change now: what to confirm first."""
        return self._store.bulk.count(BulkAction(action), where)

    def act_on_jobs(
        self,
        action: str,
        where: JobFilter,
        *,
        everything: bool = False,
        stop: Callable[[], bool] | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> Changed:
        """Retry (failed or cancelled), cancel (queued or running: a running one is stopped by its owner within a
        heartbeat) or delete (finished, with their runs) every job `where` picks, as the single actions do, a
        batch of jobs to a short transaction. How many it changed (an int), with `.busy`: how many it found held
        by another transaction and left unchanged (run it again for those). An empty filter is refused unless
        `everything`; `stop()` is asked before each batch, `progress(changed so far)` told after each."""
        return bulkjobs.act(self._store, action, where, everything=everything, stop=stop, progress=progress)

    def retry_jobs(self, where: JobFilter, **options: Any) -> int:
        """act_on_jobs("retry", ...)."""
        return self.act_on_jobs(BulkAction.RETRY, where, **options)

    def cancel_jobs(self, where: JobFilter, **options: Any) -> int:
        """act_on_jobs("cancel", ...)."""
        return self.act_on_jobs(BulkAction.CANCEL, where, **options)

    def delete_jobs(self, where: JobFilter, **options: Any) -> int:
        """act_on_jobs("delete", ...)."""
        return self.act_on_jobs(BulkAction.DELETE, where, **options)

    # -- workflows and groups -----------------------------------------------

    def workflow(self, name: str | None = None) -> Workflow:
        """A graph of named steps to build with .step(name, spec, after=[names]) and enqueue in one call."""
        return self._flows.workflow(name)

    def group(self, specs: Iterable[JobSpec], *, callback: JobSpec | None = None, name: str | None = None) -> int:
        """Enqueue `specs` as one group, all or none, with `callback` run once after all of them have ended: its
        payload is how they went (docs/api.md#workflows-and-groups). The group's id."""
        return self._flows.group(specs, callback, name)

    def workflow_info(self, workflow_id: int) -> dict[str, Any]:
        """A workflow: its steps with their states and parents, and its progress (done / total)."""
        return self._flows.workflow_info(workflow_id)

    def group_info(self, group_id: int) -> dict[str, Any]:
        """A group: its progress (done / total, a count per state, the ids that failed) and its callback."""
        return self._flows.group_info(group_id)

    # -- schedules ----------------------------------------------------------

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
        return self._schedules.add(name, spec, Recurrence.parse(cron, tz, every), misfire=misfire, grace=grace)

    def list_schedules(self) -> list[dict[str, Any]]:
        """Every schedule's row, by name."""
        return self._schedules.all()

    def get_schedule(self, name: str) -> dict[str, Any]:
        """One schedule's row (NotFound if there is none of that name)."""
        return self._schedules.get(name)

    def pause_schedule(self, name: str) -> int:
        """Stop making occurrences until resumed; returns how many waiting ones were cancelled."""
        return self._schedules.pause(name)

    def resume_schedule(self, name: str) -> dict[str, Any]:
        """Start a paused schedule again from its next occurrence (those in the pause are not run)."""
        return self._schedules.resume(name)

    def remove_schedule(self, name: str) -> int:
        """Delete a schedule; returns how many of its waiting occurrences were cancelled."""
        return self._schedules.remove(name)

    def run_schedule(self, name: str, request: str | None = None) -> int:
        """Run a schedule once now, beside its regular occurrences (which stay as they are); returns the job's id.
        `request` keys it: the same request sent again (a retry, a second click, another machine) returns the
        same job instead of making another. Default: a new request each call. Its job's key says `run now`."""
        return self._schedules.run_now(name, request)

    def edit_schedule(self, name: str, **changes: Unpack[ScheduleChanges]) -> dict[str, Any]:
        """Change what is given of a schedule (ScheduleChanges), checked as schedule() checks it; the rest stays. A
        new recurrence (cron, tz or every; see rules.schedules.edited) starts at its next occurrence more than two
        periods from now, with no burst of those it would have had; a paused schedule stays paused. `payload` is
        JSON text (None: none); a command's `target` may be its argv as a list. New work applies to the
        occurrences still waiting."""
        return self._schedules.edit(name, changes)

    def schedule_runs(self, name: str, limit: int = 10) -> list[dict[str, Any]]:
        """A schedule's last `limit` occurrences that ran (or ended without running), newest first, as their runs:
        outcome, machine, start, due time, lateness (`late`: start minus due) and whether it was a run-now
        (`manual`). See store.schedules.ScheduleStore.last_runs."""
        return self._schedules.runs(name, limit)

    # -- singletons, grabs and locks ----------------------------------------

    def singleton(self, name: str, spec: JobSpec) -> int:
        """Keep `spec` running on exactly one live machine; returns its job id."""
        self.check_allowed(spec)
        return singletons.add(self._store, name, grabs.signed(spec))

    def list_singletons(self) -> list[dict[str, Any]]:
        """Every singleton (its job's row and `name`), by name."""
        return singletons.list_all(self._store)

    def remove_singleton(self, name: str) -> str:
        """Stop a singleton for good: "cancelled" at once if it waits, "cancelling" (within a heartbeat) if it runs."""
        return singletons.remove(self._store, name)

    def grab(self, key: str, instance: str, spec: JobSpec) -> int:
        """Enqueue `spec` as the one job for `key` + `instance`. Returns its id, or raises
        grabs.AlreadyTaken saying who won and whether it finished (wait for it with `wait`)."""
        return self.enqueue(replace(spec, key=grabs.grab_key(key, instance)))[0]

    def wait_grab(self, job_id: int, timeout: float | None = None) -> grabs.Holder:
        """wait() for a grabbed job, answered as its holder: where it ran, how it ended, its last output."""
        return grabs.wait(self._store, job_id, timeout)

    def lock(self, name: str, wait: float | None = None) -> singletons.Lock:
        """A distributed lock: `with farm.lock("name") as lock:` (lock.fence, lock.lost). `wait`: seconds
        to wait for it (None: for ever), then singletons.LockHeld."""
        timing = self._shared.timing()
        return singletons.Lock(self._store, name, lease=timing.lease, renew_every=timing.heartbeat, wait=wait)

    # -- queues -------------------------------------------------------------

    def queues(self) -> list[QueueInfo]:
        """Every queue with work, settings or a machine serving it by name (and `default`), by name."""
        return self._queues.all()

    def queue(self, name: str) -> QueueInfo:
        """One queue, as queues() shows it (NotFound for a name no job, setting or machine has used but
        `default`'s), its settings and counts read alone."""
        return self._queues.one(name)

    def queue_keys(self, name: str, most: int = 10) -> list[KeyUse]:
        """The `most` busiest fairness keys of queue `name`: the units each has running, its jobs waiting and, with a
        rate per key, its bucket's tokens now (docs/design.md §9)."""
        return self._queues.keys(name, most)

    def serving(self, queue: str) -> tuple[str, ...]:
        """The names of the live machines that serve `queue` (none: its jobs wait until one joins)."""
        return self._machines.serving(queue)

    def pause_queue(self, name: str) -> None:
        """Start nothing more of queue `name`, farm-wide, from the next claim on; running jobs finish."""
        self._queues.pause(name, True)

    def resume_queue(self, name: str) -> None:
        """Start the jobs of a paused queue again, from the next claim on."""
        self._queues.pause(name, False)

    def set_queue(self, name: str, **settings: Unpack[QueueSettings]) -> None:
        """Change what is given of a queue's farm-wide settings (QueueSettings says what each is; None removes one;
        others stay): its limit, rate, order keys' failure policy, retention, fair share, limit and rate per
        fairness key, where keyless jobs take their key, breaker and adaptive rate (docs/design.md §9)."""
        self._queues.set(name, **settings)

    def reset_breaker(self, name: str) -> None:
        """Close queue `name`'s breaker now, at its configured rate (BadQueueInput: no breaker, no adaptive rate)."""
        self._queues.reset_breaker(name)

    # -- machines -----------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """Machines with their judged state and clock sync, job counts, and the database's time."""
        return self._machines.status(self.masked_url, self.current_settings())

    def turns(self, seconds: float = 60.0) -> list[dict[str, Any]]:
        """The turn log of the last `seconds` of database time: which machine took which slot."""
        return self._machines.turns(seconds)

    def steer(self, machine: str, wish: str) -> dict[str, Any]:
        """Ask a machine (by name or id) to pause, resume or drain."""
        return self._machines.steer(machine, wish)

    def dashboard(self, clock: Callable[[], float] = time.monotonic) -> "Dashboard":
        """What a dashboard reads at each poll (views.Dashboard.read), for this farm's timing."""
        from .views import Dashboard  # the app's reading: not the CLI's

        return Dashboard(self._store, FarmTiming.of(self.settings()), clock)

    # -- the farm's past ----------------------------------------------------

    def stats(self, since: float = 86400.0, *, step: int = 60, queue: str | None = None) -> list[dict[str, Any]]:
        """The farm's history per queue (docs/design.md §11) over the last `since` seconds, in buckets of `step`
        seconds (a multiple of 60; past a day the rows are hours), oldest first: jobs enqueued, started and ended by
        outcome, the jobs waiting, and the median and 95th percentile of the runs' durations (seconds)."""
        return farm_past.stats(self._store, since, step, queue)

    def events(self, since: float = 86400.0, *, kind: str | None = None, limit: int = 10_000) -> list[dict[str, Any]]:
        """The farm's log of what happened and who did it (docs/design.md §11) over the last `since` seconds, oldest
        first (the newest `limit`): each event's time (`at`), `kind` (rules.events.EventKind), `subject`, `detail`
        and `actor`. `kind`: one kind, or a family of them (`machine`, `queue`, `schedule`, `jobs`, `database`)."""
        return farm_past.events(self._store, since, kind, limit)
