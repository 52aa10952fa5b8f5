"""The machines as the Farm reads and steers them: which are live (judged by the farm's liveness), whether their
allow-lists let a job run, who serves a queue, the status an operator reads, the turn log, and a wish on one."""

from collections.abc import Callable
from typing import Any

from .rules.allow import check_allowed
from .rules.job import JobSpec
from .rules.queues import serving_machines
from .rules.roster import Liveness, machine_status
from .rules.states import SERVING
from .store.stores import Store


class Machines:
    """`liveness` is asked at each read: the farm's timing may be adopted after the Farm is opened."""

    def __init__(self, store: Store, liveness: Callable[[], Liveness]):
        self._store = store
        self._liveness = liveness

    def _judged(self) -> tuple[float, list[dict[str, Any]]]:
        """The database's time and every machine row, each with its `status` as judged at that time."""
        now, _, rows = self._store.machines.read()
        liveness = self._liveness()
        for row in rows:
            row["status"] = machine_status(row, now, liveness)
        return now, rows

    def live(self) -> list[dict[str, Any]]:
        """The machine rows that still take work (active or paused, not dead)."""
        return [row for row in self._judged()[1] if row["status"] in SERVING]

    def allowing(self, *specs: JobSpec) -> list[dict[str, Any]]:
        """Refuse, with the reason, work that no live machine's allow-lists would let it run (one read for all
        `specs`); the live machines' rows it read."""
        live = self.live()
        allows = [m["allow"] for m in live if m["allow"]]
        for spec in specs:
            check_allowed(spec, allows)
        return live

    def serving(self, queue: str) -> tuple[str, ...]:
        return serving_machines(self.live(), queue)

    def status(self, database: str, settings: dict[str, float]) -> dict[str, Any]:
        """Machines with their judged state and clock sync, job counts, and the database's time."""
        now, rows = self._judged()
        return {
            "db_now": now,
            "database": database,
            "settings": settings,
            "machines": rows,
            "jobs": self._store.jobs.counts(),
        }

    def turns(self, seconds: float) -> list[dict[str, Any]]:
        return self._store.turns.read(self._store.ask_time() - seconds)

    def steer(self, machine: str, wish: str) -> dict[str, Any]:
        row = self._store.machines.find(machine)
        self._store.machines.wish(row["id"], wish)
        return row
