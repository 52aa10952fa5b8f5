"""A command job of real duration that the recording service can judge (tests/support/httptarget.py).

    python -I slow_command.py <service base URL> <seconds>

It holds one request, GET <base>sleep/<seconds>, open for its whole run, with the X-QP-Job, -Attempt, -Fence and
-Machine headers an HTTP job sends, taken from the QP_JOB_ID, QP_ATTEMPT, QP_FENCE and QP_MACHINE its node gives
it: the service's record of that request is the command's [start, end] and fence, so it is judged for overlaps
exactly as an HTTP job is. When the process dies (stopped by its node, or by anything else) the connection
closes and the service records the end there. Exit 0 on a 200, 1 otherwise. It writes nothing while it works:
a node killed under it takes its output pipe along, and a write would end it where a real command runs on.
Standard library only, so that it runs under any interpreter the node is allowed to start.
"""

import os
import sys
import urllib.error
import urllib.request

HEADERS = {
    "X-QP-Job": "QP_JOB_ID",
    "X-QP-Attempt": "QP_ATTEMPT",
    "X-QP-Fence": "QP_FENCE",
    "X-QP-Machine": "QP_MACHINE",
}


def main(base: str, seconds: str) -> int:
    headers = {header: os.environ.get(name, "") for header, name in HEADERS.items()}
    request = urllib.request.Request(f"{base.rstrip('/')}/sleep/{seconds}", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=float(seconds) + 60) as response:
            return 0 if response.status == 200 else 1
    except (urllib.error.URLError, OSError):
        return 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
