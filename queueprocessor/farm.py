"""The Python API: connect to a farm, enqueue work, look at it, steer its machines.

    from queueprocessor.farm import Farm
    farm = Farm("postgresql://qp:secret@db/farm")
    farm.enqueue_http("/reports/daily", delay=30)
    print(farm.status()["machines"])

The CLI and the desktop app are thin layers over this class.
"""

import json
import math

from sqlalchemy import exc

from .database import default_url, describe_failure, ensure_schema, mask, open_engine
from .errors import ConfigError, InvalidJob
from .executors import HttpExecutor, executor_for
from .node import Node, NodeConfig
from .roster import Liveness, machine_status
from .store import JobSpec, Store

MAX_PAYLOAD = 64 * 1024
# Settings every machine must share, or turns and death verdicts would disagree.
FARM_SETTINGS = ("period", "heartbeat", "misses")
DEFAULTS = {"period": 1.0, "heartbeat": 1.0, "misses": 3}


def parse_payload(text: str | None) -> str | None:
    """Check that a payload is JSON within the size limit; return it normalised."""
    if text is None or text == "":
        return None
    if len(text.encode()) > MAX_PAYLOAD:
        raise InvalidJob(f"payload is {len(text.encode())} bytes, over the {MAX_PAYLOAD} byte limit: "
                         "store large data elsewhere and pass a reference")
    try:
        return json.dumps(json.loads(text), separators=(",", ":"))
    except json.JSONDecodeError as error:
        raise InvalidJob(f"payload is not valid JSON ({error.msg} at line {error.lineno} column {error.colno}): "
                         "quote it, e.g. --payload '{\"id\": 1}'") from None


class Farm:
    def __init__(self, url: str | None = None):
        self.url = url or default_url()
        self.engine = open_engine(self.url)
        try:
            self.created = ensure_schema(self.engine)
        except exc.DBAPIError as error:
            self.engine.dispose()
            raise describe_failure(error, self.url) from None
        self.store = Store(self.engine)
        self._settings = None

    @property
    def masked_url(self) -> str:
        return mask(self.url)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    # -- settings ---------------------------------------------------------

    def settings(self, **wanted) -> dict[str, float]:
        """The farm-wide timing settings. Values passed in are adopted by a new farm and
        must match an existing one."""
        given = {k: v for k, v in wanted.items() if v is not None}
        stored = self.store.adopt_settings({k: repr(float(given.get(k, DEFAULTS[k]))) for k in FARM_SETTINGS})
        farm = {k: float(stored[k]) for k in FARM_SETTINGS}
        for key, value in given.items():
            if not math.isclose(float(value), farm[key]):
                raise ConfigError(
                    f"this farm uses --{key} {farm[key]:g} (every machine must agree); "
                    f"start the node without --{key}, or with --{key} {farm[key]:g}"
                )
        return farm

    def liveness(self) -> Liveness:
        s = self.settings()
        return Liveness(s["heartbeat"] * s["misses"])

    def node(self, *, name: str | None = None, capacity: int = 4, period: float | None = None,
             heartbeat: float | None = None, misses: int | None = None, http_base: str = "http://localhost/",
             clock=None, **extra) -> Node:
        farm = self.settings(period=period, heartbeat=heartbeat, misses=misses)
        if capacity < 1:
            raise ConfigError(f"--capacity must be at least 1 (got {capacity})")
        config = NodeConfig(capacity=capacity, period=farm["period"], heartbeat=farm["heartbeat"],
                            misses=int(farm["misses"]), http_base=http_base, **extra)
        if name:
            config.name = name
        return Node(self.store, config, clock=clock, executors={"http": HttpExecutor(http_base)})

    # -- work -------------------------------------------------------------

    def enqueue_http(self, path: str, *, method: str = "GET", payload: str | None = None, delay: float = 0.0,
                     at: float | None = None, priority: int = 0, max_attempts: int = 3,
                     timeout: float | None = None, count: int = 1, key: str | None = None) -> list[int]:
        spec = JobSpec(executor="http", target=path, method=method.upper(), payload=parse_payload(payload),
                       priority=priority, max_attempts=max_attempts, timeout=timeout, key=key)
        return self.enqueue(spec, delay=delay, at=at, count=count)

    def enqueue(self, spec: JobSpec, *, delay: float = 0.0, at: float | None = None, count: int = 1) -> list[int]:
        executor_for({"http": HttpExecutor()}, spec.executor).validate(spec)
        if count < 1:
            raise InvalidJob(f"--count must be at least 1 (got {count})")
        if spec.max_attempts < 1:
            raise InvalidJob(f"--max-attempts must be at least 1 (got {spec.max_attempts})")
        if spec.timeout is not None and spec.timeout <= 0:
            raise InvalidJob(f"--timeout must be positive (got {spec.timeout})")
        if delay < 0:
            raise InvalidJob(f"--delay must not be negative (got {delay})")
        return self.store.enqueue(spec, delay=delay, at=at, count=count)

    # -- looking ----------------------------------------------------------

    def status(self) -> dict:
        """Machines with their judged state and clock sync, job counts, and the database's time."""
        liveness = self.liveness()
        now, _, rows = self.store.read_machines()
        for row in rows:
            row["status"] = machine_status(row, now, liveness)
        return {"db_now": now, "database": self.masked_url, "settings": self.settings(),
                "machines": rows, "jobs": self.store.job_counts()}

    def steer(self, machine: str, wish: str) -> dict:
        """Ask a machine (by name or id) to pause, resume or drain."""
        row = self.store.find_machine(machine)
        self.store.wish(row["id"], wish)
        return row
