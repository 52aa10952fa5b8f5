"""One enqueuing machine of a test: a process of its own with its own Farm on the test's database, enqueuing the
same keyed HTTP job again and again, as an application on another server would.

    python -m tests.support.enqueuer URL PATH COUNT OPTIONS_JSON MACHINE

It opens its Farm, prints `ready` and waits for a line on stdin (so that every machine starts at once), then makes
COUNT calls of `farm.enqueue_http(PATH, method="POST", payload={"machine": MACHINE, "seq": n}, **OPTIONS)`, one
after the other, and prints one JSON line: the ids the calls returned, and the database's clock read just before
and just after its last call (`before`, `after`). A machine's calls are one after the other, so its last is the last
of its own to commit; whether it was the last of all the machines' is bounded by those two readings.
"""

import json
import sys

from queueprocessor.farm import Farm


def main(url: str, path: str, count: int, options: dict, machine: int) -> dict:
    with Farm(url) as farm:
        farm._store.ask_time()  # the pool open and the clock's statement built before the start
        print("ready", flush=True)
        sys.stdin.readline()
        ids = set()
        for seq in range(count - 1):
            ids.update(farm.enqueue_http(path, method="POST", payload=payload(machine, seq), **options))
        before = farm._store.ask_time()
        ids.update(farm.enqueue_http(path, method="POST", payload=payload(machine, count - 1), **options))
        after = farm._store.ask_time()
    return {"machine": machine, "ids": sorted(ids), "last": count - 1, "before": before, "after": after}


def payload(machine: int, seq: int) -> str:
    return json.dumps({"machine": machine, "seq": seq})


if __name__ == "__main__":
    url, path, count, options, machine = sys.argv[1:]
    print(json.dumps(main(url, path, int(count), json.loads(options), int(machine))), flush=True)
