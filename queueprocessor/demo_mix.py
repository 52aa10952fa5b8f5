"""The demo's work: a mix that shows every capability of the farm at once, each in a queue named for it.

`prepare` sets the queues up (a limit, a rate, order keys, fair shares, a breaker) and adds the schedule, the
singleton and the failures to retry in bulk; `feed` keeps the rest coming: plain HTTP jobs, order keys, shares,
a debounced key, a workflow that fans out and in, a group with a callback, long jobs reporting progress, a batch
function. The functions below are the demo's Python jobs: the demo's nodes allow this module (MODULE).

Kept cheap on a small machine: about four jobs a second in all, the web target answers at once or sleeps, the
Python jobs wait on their cancel flag instead of computing.
"""

import random
import sys
import threading
import time
from typing import Any

from .farm import Farm
from .jobfunctions import job
from .rules.errors import NotFound, QPError

MODULE = __name__
SCHEDULE = "demo-report"  # every 10 s, a run of 12 s: overlap=skip skips the next one, jitter spreads them
SINGLETON = "demo-watcher"
CUSTOMERS = ("alice", "bob", "carol")  # order keys: each customer's orders run one at a time, in order
TENANTS = {"acme": 3.0, "globex": 1.0, "initech": 1.0}  # fair shares by weight
FEED_EVERY = 0.5  # seconds between feeder ticks
QUEUES: dict[str, dict[str, Any]] = {
    "reports": dict(limit=2),  # at most 2 long reports at once across the farm
    "mail": dict(rate="2/s"),  # at most two starts a second across the farm: a burst of 8 every 5 s waits its turn
    "orders": dict(),  # order keys
    "tenants": dict(fair=True, key_limit=2),  # shares by weight, at most 2 running per tenant
    "partner": dict(rate="4/s", breaker="3/20s", cool_down="8s"),  # its target has outages: the breaker trips
}


@job(timeout=120)
def long_report(payload: dict[str, Any], context: Any) -> str:
    """A long job reporting its progress every second (the Job runs tab shows the bar); stops when told to."""
    steps = int(payload.get("steps", 15))
    for step in range(steps):
        context.progress(step / steps, f"page {step + 1} of {steps}")
        if context.cancelled.wait(1.0):
            return "stopped"
    return f"{steps} pages"


@job(batch=25)
def index_docs(payloads: list[Any], contexts: list[Any]) -> list[Any]:
    """A batch function: one call for up to 25 jobs; each job's result is its own."""
    time.sleep(0.2)
    return [f"indexed doc {payload['doc']} in a call of {len(payloads)}" for payload in payloads]


@job
def group_done(payload: Any, context: Any) -> str:
    """A group's callback: its payload says how the group's jobs went."""
    return f"group done: {payload}"


@job(max_attempts=1000)
def watch_feed(payload: Any, context: Any) -> str:
    """A singleton: continuous work one live machine holds; another takes it over when that one dies."""
    polls = 0
    while not context.cancelled.wait(2.0):
        polls += 1
        context.progress(polls % 10 / 10, f"polled the feed {polls} times")
    return f"polled {polls} times"


def prepare(farm: Farm) -> None:
    """The queues (a queue exists once a job is in it) and their settings, the schedule, the singleton, and jobs
    that fail at once: retry them in bulk once their target is up."""
    farm.enqueue_http("/import", queue="imports", max_attempts=1, count=12)  # down at first: 12 failures
    farm.enqueue_http("/partner", queue="partner", count=5)
    farm.enqueue_python(long_report, {"steps": 20}, queue="reports", count=2)
    farm.enqueue_http("/ok?to=mail", queue="mail", count=5)
    for customer in CUSTOMERS:
        farm.enqueue_http("/slow?ms=700", queue="orders", order_key=customer, count=2)
    for tenant, weight in TENANTS.items():
        farm.enqueue_http("/slow?ms=1500", queue="tenants", fair_key=tenant, fair_weight=weight, count=3)
    for name, settings in QUEUES.items():
        if settings:
            farm.set_queue(name, **settings)
    try:
        farm.get_schedule(SCHEDULE)
    except NotFound:
        spec = farm.http_spec("/slow?ms=12000&from=schedule", timeout=60)
        farm.schedule(SCHEDULE, spec, every=10.0, overlap="skip", jitter=3.0)
    try:
        farm.singleton(SINGLETON, farm.python_spec(watch_feed, max_attempts=1000))
    except QPError:  # there already
        pass


class Feeder:
    """What the demo enqueues as it runs: a tick every FEED_EVERY seconds, each kind of work at its own pace."""

    def __init__(self, farm: Farm):
        self.farm = farm
        self.tick = 0

    def step(self) -> None:
        self.tick += 1
        every = self._every
        self.plain()
        if every(2):
            customer = random.choice(CUSTOMERS)
            self.farm.enqueue_http(f"/slow?ms={random.randrange(300, 1500, 100)}", queue="orders", order_key=customer)
        if every(3):
            self.farm.enqueue_http("/partner", queue="partner")
            tenant = random.choice(list(TENANTS))
            self.farm.enqueue_http(
                "/slow?ms=1500", queue="tenants", fair_key=tenant, fair_weight=TENANTS[tenant], count=2
            )
        if every(10):
            self.farm.enqueue_http("/ok?to=mail", queue="mail", count=8)
        if every(5):  # edits of one document: a save 4 s after the last edit, 15 s after the first at most
            self.farm.enqueue_http("/ok?save=doc-42", key="save-doc-42", debounce=4.0, max_delay=15.0)
        if every(8):
            self.farm.enqueue_python(index_docs, {"doc": self.tick}, queue="index", count=20)
        if every(30, 1):
            self.farm.enqueue_python(long_report, {"steps": random.randrange(10, 25)}, queue="reports")
        if every(40, 2):
            self._workflow()
        if every(40, 22):
            specs = [self.farm.http_spec(f"/slow?ms={ms}") for ms in (200, 600, 1000, 1400, 1800)]
            self.farm.group(specs, callback=self.farm.python_spec(group_done), name="thumbnails")

    def _every(self, ticks: int, offset: int = 0) -> bool:
        return self.tick % ticks == offset % ticks

    def plain(self) -> None:
        roll = random.random()
        path = "/ok" if roll < 0.6 else f"/slow?ms={random.randrange(200, 2500, 100)}" if roll < 0.85 else "/flaky"
        self.farm.enqueue_http(path, max_attempts=3)

    def _workflow(self) -> None:
        """Fan out and in: fetch, four resizes after it, publish after all four."""
        flow = self.farm.workflow("publish-album").step("fetch", self.farm.http_spec("/slow?ms=800"))
        sizes = [f"resize-{n}" for n in range(1, 5)]
        for size in sizes:
            flow.step(size, self.farm.http_spec(f"/slow?ms={random.randrange(500, 2500, 100)}"), after=["fetch"])
        flow.step("publish", self.farm.http_spec("/ok?publish"), after=sizes).enqueue()


def feed(farm: Farm, stop: threading.Event) -> None:
    """Feed until `stop`; a failed enqueue (the database busy or gone) is said, and feeding goes on."""
    feeder = Feeder(farm)
    while not stop.wait(FEED_EVERY):
        try:
            feeder.step()
        except Exception as error:
            print(f"demo: could not enqueue: {error}", file=sys.stderr, flush=True)
