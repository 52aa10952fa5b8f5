"""Offset error: how well a node knows the database's clock, and whether it knows how well.

A node whose wall clock is skewed by s seconds (SystemClock(skew=s)) talks to
a PostgreSQL server on the same machine, whose clock is the machine's real
clock, so its true offset (database minus local wall clock) is exactly -s.
For each skew from -2 s to +5 s this runs the node's own estimator
(OffsetEstimator over Store.sample_clock, 5 warm-up samples as a node takes at
start, then one sample per step) and, at a random moment after each sample,
compares its offset with the truth and with its own error bound.

Paths: loopback, and through a TCP delay proxy with symmetric (5/5 ms) and
asymmetric (1 ms up / 9 ms down) delay. Asymmetric delay is the known limit of
Cristian's method: the estimate is off by about (up - down) / 2 and nothing in
one round trip can tell; the error bound (rtt / 2) must still cover it.
Target: p99 error at most 2 ms on loopback.

    python bench/offset_error.py            # 6 skews x 3 paths x 2 samplers x 200 samples
    python bench/offset_error.py --quick    # 2 skews x 3 paths x 2 samplers x 40 samples
"""

import argparse
import random
import time

from common import load_average, ms, percentile, postgres, print_table
from sqlalchemy import select

from queueprocessor.rules.clock import OffsetEstimator, Sample, SystemClock
from queueprocessor.store.database import open_engine
from queueprocessor.store.dbtime import db_now
from queueprocessor.store.stores import Store
from tests.support.tcpproxy import TcpProxy

SKEWS = (-2.0, -1.0, 0.0, 1.0, 2.0, 5.0)
PATHS = (("loopback", None), ("proxy 5/5 ms", (0.005, 0.005)), ("proxy 1/9 ms", (0.001, 0.009)))
WARM_UP = 5  # samples a node takes before it joins the farm (Node.start)
TARGET = 0.002


def check_same_clock(store: Store) -> float:
    """The benchmark's premise: the server's clock is this machine's clock. Returns the worst
    distance of the database's answer from the middle of the round trip, beyond rtt/2 (should be 0)."""
    worst = 0.0
    for _ in range(50):
        w0 = time.time()
        db = store.ask_time()
        w1 = time.time()
        worst = max(worst, abs(db - (w0 + w1) / 2) - (w1 - w0) / 2)
    return worst


def published_offset(estimator: OffsetEstimator, clock: SystemClock) -> float:
    """estimator.offset(), with both clocks read at one instant: a thread preempted between
    reading the monotonic and the wall clock would add the preemption to the error."""
    while True:
        m0, wall, m1 = clock.monotonic(), clock.time(), clock.monotonic()
        if m1 - m0 < 50e-6:
            return (m0 + m1) / 2 + estimator.best().mono_offset - wall


def measure(take_sample, skew: float, samples: int, step: float, rng: random.Random) -> dict:
    clock = SystemClock(skew)
    estimator = OffsetEstimator(clock)
    for _ in range(WARM_UP):
        estimator.add(take_sample(clock))
    errors, bounds, rtts = [], [], []
    for _ in range(samples):
        estimator.add(take_sample(clock))
        time.sleep(rng.uniform(0.0, step))
        offset, bound = published_offset(estimator, clock), estimator.error_bound()
        errors.append(offset - (-skew))  # the truth: database clock = this machine's real clock
        bounds.append(bound)
        rtts.append(estimator.rtt())
    size = [abs(e) for e in errors]
    return {
        "skew": skew,
        "samples": samples,
        "mean": sum(errors) / len(errors),
        "p50": percentile(size, 50),
        "p99": percentile(size, 99),
        "max": max(size),
        "bound_p50": percentile(bounds, 50),
        "rtt_p50": percentile(rtts, 50),
        "covered": sum(1 for e, b in zip(size, bounds) if e <= b) / len(size),
    }


def samplers(engine, store: Store):
    """How a sample reaches the database: as a node does it, and as one bare round trip."""
    held = engine.connect().execution_options(isolation_level="AUTOCOMMIT")

    def bare(clock):
        t0 = clock.monotonic()
        db = held.execute(select(db_now())).scalar_one()
        return Sample(t0, clock.monotonic(), db)

    return held, [
        ("node (Store.sample_clock)", lambda clock: store.sample_clock(clock.monotonic)),
        ("one round trip", bare),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 skews x 3 paths x 40 samples (under a minute)")
    parser.add_argument("--samples", type=int, help="samples per skew, path and sampler (default 200)")
    parser.add_argument("--step", type=float, default=0.05, help="seconds between samples, at most (default 0.05)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    skews = (-2.0, 5.0) if args.quick else SKEWS
    samples = args.samples or (40 if args.quick else 200)
    rng = random.Random(args.seed)

    print(
        f"offset error: skews {', '.join(f'{s:+g}' for s in skews)} s, {samples} samples each, "
        f"{WARM_UP} warm-up samples; {load_average()}"
    )
    rows, summary = [], []
    with postgres() as server:
        for path, delays in PATHS:
            proxy = None
            url = server.url
            if delays:
                proxy = TcpProxy("127.0.0.1", server.port, *delays)
                url = server.url.replace(f":{server.port}/", f":{proxy.start()}/")
            engine = open_engine(url)
            store = Store(engine)
            held, ways = samplers(engine, store)
            try:
                if not delays:
                    print(
                        f"premise: database clock vs this machine's clock, worst gap beyond rtt/2: "
                        f"{check_same_clock(store) * 1000:.3f} ms"
                    )
                for way, ask_db in ways:
                    results = [measure(ask_db, skew, samples, args.step, rng) for skew in skews]
                    rows += [
                        [
                            path,
                            way,
                            f"{r['skew']:+g}",
                            r["samples"],
                            ms(r["rtt_p50"]),
                            ms(r["mean"], signed=True),
                            ms(r["p50"]),
                            ms(r["p99"]),
                            ms(r["max"]),
                            ms(r["bound_p50"]),
                            f"{r['covered'] * 100:.1f}%",
                        ]
                        for r in results
                    ]
                    worst_p99 = max(r["p99"] for r in results)
                    summary.append(
                        [
                            path,
                            way,
                            ms(0.0 if not delays else (delays[0] - delays[1]) / 2, signed=True),
                            ms(sum(r["mean"] for r in results) / len(results), signed=True),
                            ms(worst_p99),
                            ms(max(r["max"] for r in results)),
                            f"{min(r['covered'] for r in results) * 100:.1f}%",
                            ("yes" if worst_p99 <= TARGET else "NO") if not delays else "-",
                        ]
                    )
            finally:
                held.close()
                engine.dispose()
                if proxy:
                    proxy.stop()
    print_table(
        [
            "path",
            "sampler",
            "skew s",
            "samples",
            "rtt p50 ms",
            "mean error ms",
            "|error| p50 ms",
            "|error| p99 ms",
            "max ms",
            "error bound p50 ms",
            "bound covers error",
        ],
        rows,
    )
    print()
    print_table(
        [
            "path",
            "sampler",
            "Cristian bias (up-down)/2 ms",
            "mean error ms",
            "worst |error| p99 ms",
            "max ms",
            "bound covers error",
            "p99 <= 2 ms",
        ],
        summary,
    )
    print(f"\n{load_average()}")


if __name__ == "__main__":
    main()
