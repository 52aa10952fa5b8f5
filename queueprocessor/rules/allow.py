"""What work a machine agrees to run, checked without running anything.

A job's form (a known kind of work, a well-formed target: rules/kinds.py) and a machine's allow-lists (one per kind:
HTTP hosts, Python module prefixes, commands) are rules on text. Each node publishes its lists on its machine row;
an enqueuer refuses work that no live machine would run, with the reason (when no machine is up it can only check
the work's form, and a node that refuses it later fails that one run with the same reason). Each executor applies
the same rules to its own node's lists before it runs a job. Nothing here loads the executors (aiohttp,
subprocesses), so a command that only enqueues never does.
"""

import json
from dataclasses import dataclass

from .errors import NotAllowed
from .job import JobSpec
from .kinds import KINDS, WorkKind, kind_of
from .urls import mask


@dataclass(frozen=True)
class AllowLists:
    """A node's list for each kind of work (WorkKind.allow_field): extra HTTP hosts (the local machine is always
    allowed), Python module prefixes, commands."""

    hosts: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()

    def of(self, kind: WorkKind) -> tuple[str, ...]:
        """What these lists allow of `kind`: what it always allows, then its own list."""
        listed: tuple[str, ...] = getattr(self, kind.allow_field)
        return kind.always + tuple(entry for entry in listed if entry not in kind.always)

    def to_json(self) -> str:
        return json.dumps({kind.allow_field: list(getattr(self, kind.allow_field)) for kind in KINDS.values()})

    @classmethod
    def from_json(cls, text: str) -> "AllowLists":
        data = json.loads(text)
        return cls(**{kind.allow_field: tuple(data[kind.allow_field]) for kind in KINDS.values()})

    def check(self, spec: JobSpec) -> None:
        """Raise NotAllowed (or InvalidJob, for a malformed job) if these lists refuse `spec`."""
        kind = kind_of(spec.executor)
        check_listed(kind, spec, self.of(kind))


def check_listed(kind: WorkKind, spec: JobSpec, allowed: tuple[str, ...]) -> None:
    """Raise InvalidJob if `spec`, work of `kind`, is malformed, NotAllowed if it needs what `allowed` does not hold
    (an executor's check, with its node's list)."""
    needed = kind.check(spec.target, spec.method)
    if needed is not None and not kind.admits(needed, allowed):
        raise NotAllowed(
            kind.subject,
            needed,
            allowed,
            kind.option,
            refusal=kind.refusal,
            unlisted=kind.unlisted,
            target=mask(spec.target),
        )


def check_allowed(spec: JobSpec, published: list[str]) -> None:
    """Refuse `spec` if every live machine's published allow-lists refuse it (none published: accept)."""
    kind_of(spec.executor).check(spec.target, spec.method)
    refusals = []
    for text in published:
        try:
            AllowLists.from_json(text).check(spec)
            return
        except NotAllowed as error:
            refusals.append(error)
    if refusals:
        raise refusals[0].elsewhere()
