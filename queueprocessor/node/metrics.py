"""A node's Prometheus metrics, served over HTTP when it is started with `--metrics-port`.

Only a node that serves metrics imports this module, and with it prometheus_client. Nothing is instrumented on the
node's hot path: a collector reads the node's snapshot and its tally (queueprocessor.node.tally) when Prometheus
scrapes, so the metrics cost the node nothing between scrapes. Each node has a registry of its own, so several
nodes can serve metrics from one process (the tests, the demo).

Farm-wide gauges (queued jobs by queue, live machines) read the same for every machine, so exactly one machine
exports them, and a sum over the farm counts them once: the farm's reporter, the live machine with the lowest
id, which changes only when that machine leaves or dies (it counts the waiting jobs at most every WAITING_EVERY
seconds). The holder of the current turn would not do: it changes every period, and Prometheus scrapes each
machine at a moment of its own, so at any instant the latest scrapes of none, one or several machines would have
found them holding the turn.
"""

import errno
import logging
import math
import time
from collections.abc import Iterator, Mapping
from typing import Any, Protocol, TypeVar

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from ..rules.errors import BadSetting
from ..rules.logs import one_line
from ..rules.queues import DEFAULT
from ..rules.roster import KnownMachines, Liveness, machine_status
from ..rules.states import MachineState
from ..store.stores import Store
from ..version import __version__
from .tally import Buckets, Tally

log = logging.getLogger("queueprocessor.metrics")

GONE = (MachineState.STOPPED, MachineState.DEAD)
# Seconds a reporter reuses its count of the waiting jobs: counting a backlog of 100,000 takes the database a
# tenth of a second, too much to do at every scrape of a 1 s scrape interval.
WAITING_EVERY = 5.0
_Labels = TypeVar("_Labels", bound=tuple[str, ...])  # a series' label values


def _histogram(name: str, documentation: str, labelled: Mapping[_Labels, Buckets], labels: list[str]) -> Metric:
    """A histogram family from the tally's buckets, one series per label values (Prometheus counts cumulatively)."""
    family = HistogramMetricFamily(name, documentation, labels=labels)
    for values, buckets in sorted(labelled.items()):
        cumulative, total = [], 0
        for bound, count in zip((*buckets.bounds, math.inf), buckets.counts):
            total += count
            cumulative.append((floatToGoString(bound), total))
        family.add_metric(list(values), cumulative, buckets.sum)
    return family


def _labelled(family: CounterMetricFamily, counts: Mapping[_Labels, int]) -> CounterMetricFamily:
    """`family` with one series per label values."""
    for values, count in sorted(counts.items()):
        family.add_metric(list(values), count)
    return family


class Watched(Protocol):
    """What the metrics read of their node (node.Node): its snapshot and tally, its copy of the machine rows, and
    its store for the waiting jobs it reports."""

    tally: Tally
    store: Store

    @property
    def known(self) -> KnownMachines: ...

    def snapshot(self) -> dict[str, Any]: ...

    def liveness(self) -> Liveness: ...


class NodeCollector(Collector):
    """Turns a node's state into metrics at each scrape."""

    def __init__(self, node: Watched) -> None:
        self.node = node
        self._waiting_read: tuple[float, dict[str, int]] = (-math.inf, {})  # (monotonic time, jobs per queue)

    def collect(self) -> Iterator[Metric]:
        snapshot, reading = self.node.snapshot(), self.node.tally.read()
        if snapshot["id"] is not None:  # the endpoint is up before the node joins the farm
            info = InfoMetricFamily("queueprocessor_machine", "This node: its machine's name and id.")
            info.add_metric([], {"machine": snapshot["name"], "id": str(snapshot["id"]), "version": __version__})
            yield info
        yield _labelled(
            CounterMetricFamily("queueprocessor_jobs_claimed", "Jobs this node claimed.", labels=["queue", "executor"]),
            reading.claimed,
        )
        yield _labelled(
            CounterMetricFamily(
                "queueprocessor_jobs_finished",
                "Runs this node ended, by outcome: succeeded, failed, timeout, cancelled, "
                "lost (lease lost, self-fenced, or handed back).",
                labels=["queue", "executor", "outcome"],
            ),
            reading.ended,
        )
        yield _histogram(
            "queueprocessor_job_duration_seconds",
            "How long a job's work ran on this node.",
            reading.durations,
            ["queue", "executor"],
        )
        yield GaugeMetricFamily("queueprocessor_jobs_running", "Jobs at work on this node.", value=snapshot["running"])
        yield GaugeMetricFamily(
            "queueprocessor_jobs_capacity", "Jobs this node runs at once at most.", value=snapshot["capacity"]
        )
        yield CounterMetricFamily(
            "queueprocessor_turns_taken", "Turns (queue polls) this node took.", value=sum(reading.lateness.counts)
        )
        yield _histogram(
            "queueprocessor_turn_lateness_seconds", "How far into its slot each turn began.", {(): reading.lateness}, []
        )
        for key, name, text in (
            ("offset", "offset", "Database clock minus this machine's clock."),
            ("error_bound", "error_bound", "How far off the offset may be."),
            ("rtt", "round_trip", "Round trip of the best clock sample."),
        ):
            if snapshot[key] is not None:
                yield GaugeMetricFamily(f"queueprocessor_clock_{name}_seconds", text, value=snapshot[key])
        yield CounterMetricFamily(
            "queueprocessor_lease_renewals_failed",
            "Check-ins (each renewing every lease held) that failed.",
            value=reading.renewals_failed,
        )
        yield CounterMetricFamily(
            "queueprocessor_self_fences",
            "Times this node stopped its jobs because it could not renew their leases.",
            value=reading.fences,
        )
        yield GaugeMetricFamily(
            "queueprocessor_database_unreachable",
            "1 while this node cannot reach the database (it claims nothing then).",
            value=0 if snapshot["db_healthy"] else 1,
        )
        yield from self._farm(snapshot)

    def _farm(self, snapshot: dict[str, Any]) -> Iterator[Metric]:
        """The farm-wide gauges, from the farm's reporter only, which it finds in its heartbeat's view of the
        machines. Nothing while the database is out of reach: a scrape must not wait on it."""
        if snapshot["id"] is None or not snapshot["db_healthy"]:
            return
        now, liveness = snapshot["db_now"], self.node.liveness()
        live = [m["id"] for m in self.node.known.machines() if machine_status(m, now, liveness) not in GONE]
        reporter = min(live, default=None) == snapshot["id"]
        yield GaugeMetricFamily(
            "queueprocessor_farm_reporter",
            "1 on the one machine that exports the farm-wide gauges.",
            value=int(reporter),
        )
        if not reporter:
            return
        waiting = self._waiting()
        if waiting is None:
            return
        yield GaugeMetricFamily("queueprocessor_farm_machines_live", "Machines alive in the farm.", value=len(live))
        family = GaugeMetricFamily(
            "queueprocessor_farm_jobs_queued", "Jobs waiting in the farm's queues.", labels=["queue"]
        )
        for queue, count in sorted(waiting.items()):
            family.add_metric([queue], count)
        yield family

    def _waiting(self) -> dict[str, int] | None:
        """Jobs waiting per queue (DEFAULT always named), read at most once per WAITING_EVERY; None if the
        database cannot be asked."""
        read_at, waiting = self._waiting_read
        if time.monotonic() - read_at < WAITING_EVERY:
            return waiting
        try:
            counts = self.node.store.queues.counts()
        except Exception as error:  # the database went away since the last check-in: the node says so itself
            log.debug("farm gauges skipped: %s", one_line(error))
            return None
        waiting = {DEFAULT: 0} | {queue: counted[0] for queue, counted in counts.items()}
        self._waiting_read = (time.monotonic(), waiting)
        return waiting


class Exporter:
    """The HTTP endpoint serving one node's metrics, on a thread named qp-metrics."""

    def __init__(self, node: Watched, host: str, port: int) -> None:
        """Listen on host:port (0: any free port); BadSetting if that cannot be done."""
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(NodeCollector(node))
        ProcessCollector(registry=self.registry)
        try:
            self.server, self.thread = start_http_server(port, host, self.registry)
        except OSError as error:  # in use, not an address of this machine, a privileged port
            reason = "the port is in use" if error.errno == errno.EADDRINUSE else error.strerror or str(error)
            raise BadSetting(
                "cannot serve metrics on {host} port {value}: {reason}; choose another {0} or {1}",
                "metrics_port",
                "metrics_host",
                value=port,
                host=host,
                reason=reason,
            ) from None
        self.thread.name = "qp-metrics"
        self.host = host
        log.info("serving metrics at %s", self.url)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.server.server_port}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
