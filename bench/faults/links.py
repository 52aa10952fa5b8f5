"""Links: a node's database link cut or black-holed at a TCP proxy, and a node partitioned from both the database
and the service with its writes in flight."""

import time
import urllib.error
import urllib.request

from common import query, wait_for

from tests.support.tcpproxy import TcpProxy

from .judge import log_times, tally_of
from .rig import LONG, QUICK, Outcome, Rig, secs, turns_out_of_turn, wait_checked_in


def cut_off(server, quick: bool, mode: str = "cut") -> Outcome:
    """One node's database link cut at a TCP proxy while it runs long jobs: connections reset (`cut`), or
    packets silently dropped (`blackhole`, the harder case: its statements hang instead of failing)."""
    timing = QUICK if quick else LONG
    length = 4 * timing.lease
    rig = Rig(server, timing, capacity=2)
    proxy = TcpProxy("127.0.0.1", server.port)
    proxy.start()
    try:
        victim = rig.start("cut-off", url=rig.url.replace(f":{server.port}/", f":{proxy.port}/"))
        peers = [rig.start(f"peer-{i}") for i in range(2)]
        ids = rig.wait_roster()
        machine = rig.machine_id(victim)
        with rig.paused(peers):  # so that the victim takes the jobs
            rig.farm.enqueue_http(f"/sleep/{length:g}", count=rig.capacity)
            wait_for(lambda: len(rig.requests_from(machine, "/sleep")) == rig.capacity, 30, "the node to be busy")
        held = {r["job"] for r in rig.requests_from(machine, "/sleep")}
        proxy.cut() if mode == "cut" else proxy.freeze()
        cut = time.time()
        rig.downed[machine] = (cut, "cut off")
        wait_for(
            lambda: all(
                any(r["job"] == job and r["machine"] != machine for r in rig.target.requests()) for job in held
            ),
            30,
            "its jobs to run elsewhere",
        )
        time.sleep(timing.lease)
        proxy.restore()
        restored = time.time()
        rejoined = wait_checked_in(rig, [machine], restored, 30)
        rig.settle(length * 4 + 30)
        stopped_after = max(r["ended"] for r in rig.requests_from(machine, "/sleep") if r["job"] in held) - cut
        taken_after = (
            min(r["started"] for r in rig.target.requests("/sleep") if r["job"] in held and r["machine"] != machine)
            - cut
        )
        wrong, _ = turns_out_of_turn(rig, ids, restored + rejoined + timing.join_delay, time.time())
    finally:
        rig.close()
        proxy.stop()
    tally = tally_of(rig)
    how = "connections reset" if mode == "cut" else "packets dropped, statements hang"
    return Outcome(
        mode,
        f"a node cut off from the database ({how}) while running {length:g} s jobs (3 nodes)",
        tally,
        recovery=f"the cut-off node stopped its {len(held)} jobs {secs(stopped_after)} after the cut (lease "
        f"{timing.lease:g} s); they ran elsewhere {secs(taken_after)} after it; it checked in again "
        f"{secs(rejoined)} after the link came back",
        facts={
            "held": len(held),
            "stopped_after": stopped_after,
            "taken_after": taken_after,
            "rejoined": rejoined,
            "lease": timing.lease,
            "wrong_turns_after_rejoin": wrong,
        },
    )


def partition(server, quick: bool) -> Outcome:
    """One node partitioned from both the database and the service with its writes in flight, then healed:
    the writes it sent before the partition arrive late, after other machines took its jobs over."""
    timing = QUICK if quick else LONG
    count = 300 if quick else 1000
    rig = Rig(server, timing)
    db_proxy = TcpProxy("127.0.0.1", server.port)
    web_proxy = TcpProxy("127.0.0.1", rig.target.port, up_delay=1.0)  # a slow link keeps its writes in flight
    db_proxy.start()
    web_proxy.start()
    try:
        victim = rig.start(
            "partitioned",
            url=rig.url.replace(f":{server.port}/", f":{db_proxy.port}/"),
            http_base=f"http://127.0.0.1:{web_proxy.port}/",
        )
        peers = [rig.start(f"peer-{i}") for i in range(2)]
        rig.wait_roster()
        machine = rig.machine_id(victim)

        def in_flight():
            """The node's running jobs whose write has not reached the service yet."""
            seen = {(r["job"], r["fence"]) for r in rig.requests_from(machine, "/write")}
            return [
                row
                for row in query(
                    rig.url, "SELECT id, fence FROM qp_jobs WHERE owner = :m AND state = 'running'", m=machine
                )
                if tuple(row) not in seen
            ]

        batch_ids: list[int] = []
        with rig.paused(peers):  # the victim does the work until the partition comes; then its peers take over
            for i in range(count):
                rig.farm.enqueue_http(f"/write/report-{i % 10}", method="POST", payload=f'{{"row": {i}}}')
                if i % 4 == 0:  # a batch function's jobs, writing through the same slow link
                    batch_ids += rig.batches(1, f"write/batch-{i % 10}", base=f"http://127.0.0.1:{web_proxy.port}/")
            wait_for(lambda: len(rig.requests_from(machine, "/write")) >= rig.capacity, 60, "the node to write")
            batch = set(batch_ids)
            wait_for(
                lambda: any(job in batch for job, _ in in_flight()),
                30,
                "a write of the node's in flight, a batch function's among them",
                poll=0.01,
            )
            db_proxy.freeze()
            web_proxy.freeze()
            frozen = time.time()
            rig.downed[machine] = (frozen, "partitioned")
        time.sleep(max(0.0, frozen + timing.lease + 4 * timing.period - time.time()))
        db_proxy.restore()
        web_proxy.restore()
        healed = time.time()
        rig.settle(120)
        time.sleep(timing.heartbeat)
        writes = rig.target.requests("/write")
        late = [
            r
            for r in rig.requests_from(machine, "/write")
            if r["started"] >= healed
            and any(o["job"] == r["job"] and o["fence"] > r["fence"] and o["started"] < r["started"] for o in writes)
        ]
        # Whether a write in flight arrives late depends on how its connection closed; a straggler that
        # does arrive is exactly such a request, so each job taken from the node is also sent once more
        # as it sent it, with its fence.
        taken = query(
            rig.url,
            "SELECT job_id, fence FROM qp_runs WHERE machine_id = :m AND outcome = 'lost' "
            "AND error LIKE 'lease expired%'",
            m=machine,
        )
        stragglers = [straggle(rig.target.base_url, job, fence, machine) for job, fence in taken]
        stopped_at = min(log_times(victim, "no contact with the database"), default=None)
        refused = len(log_times(victim, "refused by its fence"))
    finally:
        rig.close()
        db_proxy.stop()
        web_proxy.stop()
    tally = tally_of(rig)
    late_accepted = sum(bool(r["accepted"]) for r in late)
    return Outcome(
        "partition",
        f"a node partitioned from database and service for {healed - frozen:.1f} s with its writes "
        f"in flight, then healed (3 nodes, {count} POST /write jobs and {len(range(0, count, 4))} of a batch "
        "function writing likewise)",
        tally,
        recovery=f"the partitioned node stopped its jobs {secs(stopped_at and stopped_at - frozen)} into the "
        f"partition (lease {timing.lease:g} s); {len(late)} of its writes to the service arrived after the "
        f"heal with an old fence: {len(late) - late_accepted} refused (409), {late_accepted} accepted; "
        f"{refused} of its results reached the database late and were refused by the fence; "
        f"{len(stragglers)} stragglers replayed: {stragglers.count(409)} refused (409)",
        facts={
            "late_writes": len(late),
            "late_accepted": late_accepted,
            "late_results_refused": refused,
            "stragglers": stragglers,
            "self_stop_after": None if stopped_at is None else stopped_at - frozen,
            "lease": timing.lease,
        },
    )


def straggle(base_url: str, job: int, fence: int, machine: int) -> int:
    """POST a write for `job` as the machine that held it under `fence` did; the service's answer."""
    headers = {"X-QP-Job": str(job), "X-QP-Fence": str(fence), "X-QP-Machine": str(machine)}
    request = urllib.request.Request(f"{base_url}write/straggler", data=b"{}", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
