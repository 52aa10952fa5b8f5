"""A module whose import waits until the file named by QP_TEST_IMPORT_GATE exists: an import that hangs (a
connection made at import time to a service that does not answer)."""

import os
import time

_gate = os.environ.get("QP_TEST_IMPORT_GATE")
while _gate and not os.path.exists(_gate):
    time.sleep(0.02)


def run(payload, context):
    return "imported"
