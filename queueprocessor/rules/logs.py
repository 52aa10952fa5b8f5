"""How a process that runs a node writes its log: text for a terminal, or one JSON object per line for a log store.

Every entry point (the CLI, `queueprocessor gui`, the desktop app) configures logging here, so both formats mask
passwords the same way: a handler filter masks each record's message and traceback before any formatter sees it.
A log call about a job names it with `extra=about(job_id)`; the JSON lines carry it as "job_id", so a log store
can gather one job's story across machines.
"""

import json
import logging
from datetime import UTC, datetime
from enum import StrEnum

from .urls import mask

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class LogFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


def about(job_id: int) -> dict[str, int]:
    """The `extra` of a log call about one job."""
    return {"job_id": job_id}


def one_line(exc: BaseException) -> str:
    """An error as one line fit for the log (a password in a driver's message masked)."""
    return mask(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)


class MaskPasswords(logging.Filter):
    """Masks database URLs' passwords in a record's message and traceback (a driver's error may quote the URL)."""

    _formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = mask(record.getMessage()), None
        if record.exc_info and not record.exc_text:
            record.exc_text = mask(self._formatter.formatException(record.exc_info))
        return True


class JsonLines(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, machine, message, job_id (when the record
    is about a job) and exception (a traceback, when there is one)."""

    def __init__(self, machine: str):
        super().__init__()
        self.machine = machine

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "machine": self.machine,
            "message": record.getMessage(),
        }
        job_id = getattr(record, "job_id", None)  # set by about(): extra={"job_id": ...}
        if job_id is not None:
            entry["job_id"] = job_id
        if record.exc_text:
            entry["exception"] = record.exc_text
        elif record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure(level: int, log_format: LogFormat = LogFormat.TEXT, machine: str = "") -> None:
    """Send this process's log to stderr at `level`, in `log_format` (JSON lines name `machine`), replacing what
    an earlier call set up (the CLI configures before it knows the command, `node` again with its options)."""
    handler = logging.StreamHandler()
    handler.addFilter(MaskPasswords())
    handler.setFormatter(JsonLines(machine) if log_format == LogFormat.JSON else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler], force=True)
