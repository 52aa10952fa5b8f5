"""How far running jobs are, written with their lease renewal (RunStore.renew): no statement of its own, fenced as
the renewal is (a run that lost its lease writes nothing), and the renewal's own statement when nobody reported."""

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import BigInteger, Float, Text, and_, bindparam, case, literal
from sqlalchemy.sql import ColumnElement

from .dbtime import db_now
from .schema import jobs
from .sql.runs import by_id
from .types import Progress

RunKey = tuple[int, int]  # (job id, fence)


@functools.cache
def progress_renew_statement() -> Any:
    """PostgreSQL: renew_statement that also writes the progress in arrays `b_progress` and `b_message` (NULL where a
    run reported nothing new: its progress stays)."""
    v, ours = by_id([("id", BigInteger), ("fence", BigInteger), ("progress", Float), ("message", Text)])
    said = v.c.progress.isnot(None)
    return (
        jobs.update()
        .where(ours)
        .values(
            lease_until=db_now() + bindparam("b_lease", type_=Float),
            progress=case((said, v.c.progress), else_=jobs.c.progress),
            progress_message=case((said, v.c.message), else_=jobs.c.progress_message),
        )
        .returning(jobs.c.id, jobs.c.fence, jobs.c.cancel_requested)
    )


def progress_arrays(held: Sequence[RunKey], news: Mapping[RunKey, Progress]) -> dict[str, list[Any]]:
    """progress_renew_statement's arrays, in the order of `held` (the renewal's `b_id` and `b_fence`)."""
    said = [news.get(key) for key in held]
    return dict(
        b_progress=[p.fraction if p else None for p in said],
        b_message=[p.message if p else None for p in said],
    )


def progress_values(news: Mapping[RunKey, Progress]) -> dict[str, ColumnElement[Any]]:
    """The other dialects: the renewal's extra SET clauses, one CASE arm per run that reported; none without news."""
    if not news:
        return {}
    runs = [(and_(jobs.c.id == job_id, jobs.c.fence == fence), p) for (job_id, fence), p in news.items()]
    return dict(
        progress=case(*((run, literal(p.fraction, Float)) for run, p in runs), else_=jobs.c.progress),
        progress_message=case(*((run, literal(p.message, Text)) for run, p in runs), else_=jobs.c.progress_message),
    )
