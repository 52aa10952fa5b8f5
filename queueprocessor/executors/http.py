"""HTTP jobs: a GET or POST to a path on the node's own web server (the seeds' jobs are pages),
or to an absolute URL on a host in the node's allow-list (default: this machine only).

The fence token travels in X-QP-Fence so the downstream service can refuse a
writer that lost its lease. A POST sends the payload as its JSON body; a GET sends
it as query parameters, which only a flat JSON object of scalars can be (see
query_of): any other payload fails the run at once, with the reason. A target that answers 429 or 503 with a
Retry-After header snoozes its job for that long, without spending an attempt (see throttled, retry_after).

The HTTP client (aiohttp, yarl) is imported by the first HTTP job: a node that
never runs one is 10 MB smaller (an idle node's budget is 60 MB). That import takes
0.15-0.3 s, so a job claimed ahead of its time (a schedule's occurrence) has it
done in a worker thread while it waits (warm), and a node's first occurrence still
starts on time.
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import suppress
from typing import TYPE_CHECKING
from urllib.parse import urljoin, urlsplit, urlunsplit

from ..rules.allow import check_listed
from ..rules.errors import BadSetting
from ..rules.job import Claimed, JobSpec
from ..rules.kinds import HTTP, LOCAL_BASE, LOCAL_HOSTS
from ..rules.urls import HTTP_SCHEMES, mask
from .base import Executor, JobContext, JobFailed, Snooze
from .retry_after import THROTTLED, retry_after

if TYPE_CHECKING:
    import aiohttp
    from yarl import URL

RESOLVED_KEPT = 4096  # targets whose URL a node remembers (see HttpExecutor.resolve)
EXCERPT = 500  # characters of the answer kept with the run


def query_of(payload: str | None) -> dict[str, str] | None:
    """A GET's payload as query parameters: a flat JSON object of scalars, strings as they are and other values as
    JSON (`{"day": "2026-11-22", "full": true}` -> `?day=2026-11-22&full=true`). Anything else cannot be sent
    with a GET: the run fails for good, saying so."""
    if payload is None:
        return None
    try:
        data = json.loads(payload)
    except ValueError:
        data = None
    if not isinstance(data, dict) or any(isinstance(v, (dict, list)) for v in data.values()):
        raise JobFailed(
            f"a GET sends its payload as query parameters, so it must be a flat JSON object such as "
            f'{{"day": "2026-11-22"}}, not {payload[:80]}: use POST to send it as a JSON body',
            permanent=True,
        )
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in data.items()}


def throttled(said: str, asked: str | None, date: str | None, excerpt: str) -> JobFailed:
    """How a run whose target answered 429 or 503 (`said`) ends: snoozed for what its Retry-After `asked` (a
    delay, or a date read against the answer's `date`), without spending an attempt; an ordinary failure without
    one, or with one that cannot be read. Either way throttled (Ending.throttled)."""
    delay = retry_after(asked, date, time.time())
    if delay is None:
        why = "no Retry-After" if asked is None else f"a Retry-After that is neither seconds nor a date: {asked[:80]!r}"
        return JobFailed(f"{said} with {why}: {excerpt[:200]}", throttled=True)
    return Snooze(delay, f"{said}, Retry-After {(asked or '').strip()[:80]}", throttled=True)


def _load_client() -> None:
    """Import the HTTP client (HttpExecutor.warm runs this in a worker thread)."""
    import aiohttp  # noqa: F401
    import yarl  # noqa: F401


class HttpExecutor(Executor):
    kind = HTTP
    name = kind.name

    def __init__(self, base_url: str = LOCAL_BASE, allowed_hosts: tuple[str, ...] = LOCAL_HOSTS):
        try:
            parts = urlsplit(base_url)
        except ValueError as error:
            raise BadSetting(
                "{0} {value} is not a valid URL ({limit})", "http_base", value=base_url, limit=str(error)
            ) from None
        if parts.scheme not in HTTP_SCHEMES or not parts.hostname:
            raise BadSetting(
                "{0} {value} is not an http(s) URL, e.g. http://localhost:8080/", "http_base", value=base_url
            )
        if parts.hostname not in allowed_hosts:
            raise BadSetting(
                "{0} host {value} is not in the allowed hosts {limit}",
                "http_base",
                value=parts.hostname,
                limit=", ".join(allowed_hosts),
            )
        self.base_url = base_url if base_url.endswith("/") else base_url + "/"
        self.allowed_hosts = tuple(allowed_hosts)
        self._session: aiohttp.ClientSession | None = None
        self._resolved: dict[tuple[str, str], URL] = {}  # (method, target) -> URL, allowed (see resolve)
        self._loading: asyncio.Future[None] | None = None  # the client's import, in a worker thread (see warm)

    def validate(self, spec: JobSpec) -> None:
        check_listed(self.kind, spec, self.allowed_hosts)

    def url_for(self, target: str) -> str:
        parts = urlsplit(target)
        if parts.scheme:  # an absolute URL on an allowed host (see validate), sent as validate read it
            return urlunsplit(parts)
        # "./" keeps a path a path: joined bare, "/http://elsewhere/x" would become that other URL.
        return urljoin(self.base_url, "./" + target.lstrip("/"))

    def resolve(self, method: str, target: str) -> URL:
        """The URL a job's target names, once it is known to be allowed (else InvalidJob or a permanent JobFailed).
        Remembered per target, parsed as the client sends it: a farm sends the same few targets thousands of
        times, and parsing each three times cost more than the request's own header building."""
        key = (method, target)
        url = self._resolved.get(key)
        if url is None:
            from yarl import URL

            self.validate(JobSpec(executor=self.name, target=target, method=method))
            text = self.url_for(target)
            try:  # checked again as the HTTP client itself reads it, so no two parsers can disagree on the host
                url = URL(text)
            except ValueError as error:
                raise JobFailed(f"{method} {mask(text)}: not a valid URL ({mask(error)})", permanent=True) from None
            if url.host not in self.allowed_hosts:
                raise JobFailed(
                    f"{method} {mask(text)}: host {url.host!r} is not allowed on this machine", permanent=True
                )
            if not urlsplit(target).scheme and not self._under_base(url):
                raise JobFailed(f"{method} {mask(text)}: leaves the HTTP base {mask(self.base_url)}", permanent=True)
            if len(self._resolved) >= RESOLVED_KEPT:
                self._resolved.clear()
            self._resolved[key] = url
        return url

    def _under_base(self, url: URL) -> bool:
        """Whether `url`, as the client sends it, is on the base's origin and under its path: what validate's
        check of a relative target's path promises, checked again on the client's own reading of it."""
        from yarl import URL

        base = URL(self.base_url)
        return url.origin() == base.origin() and url.raw_path.startswith(base.raw_path)

    async def warm(self, job: Claimed) -> None:
        if self._session is None:  # not loaded by a run yet: load it off the loop, once for every job waiting
            if self._loading is None:
                self._loading = asyncio.ensure_future(asyncio.to_thread(_load_client))
            with suppress(Exception):  # a job stopped meanwhile leaves the load to finish for the others
                await asyncio.shield(self._loading)

    async def run(self, job: Claimed, context: JobContext) -> str | None:
        import aiohttp

        url = self.resolve(job.method, job.target)
        if self._session is None:  # made on the runner's loop, which it belongs to
            # aiohttp rather than httpx: a GET to a local server costs its node 80-100 us of CPU, not 750 (see
            # docs/benchmarks.md). No cap on connections (the node's capacity is the cap); only connecting
            # has a time limit (the job's own timeout, if it has one, covers the rest). Jobs share no cookies.
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10.0),
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        headers = {
            "X-QP-Job": str(job.id),
            "X-QP-Attempt": str(job.attempts),
            "X-QP-Fence": str(job.fence),
            "X-QP-Machine": str(context.machine_id),
        }
        if context.traceparent is not None:  # a tracing node's run: the target's request joins its trace
            headers["traceparent"] = context.traceparent
        body = job.payload.encode() if job.method == "POST" and job.payload is not None else None
        if body is not None:
            headers["Content-Type"] = "application/json"
        params = query_of(job.payload) if job.method == "GET" else None
        try:  # a redirect is not followed: it could lead off the allow-list
            async with self._session.request(
                job.method, url, headers=headers, data=body, params=params, allow_redirects=False
            ) as response:
                excerpt = (await response.text(errors="replace"))[:EXCERPT]
        except aiohttp.ClientError as error:
            raise JobFailed(f"{job.method} {mask(url)}: {type(error).__name__}: {mask(error)}") from None
        if not 200 <= response.status < 300:
            said = f"{job.method} {mask(url)} answered HTTP {response.status}"
            if response.status in THROTTLED:
                raise throttled(said, response.headers.get("Retry-After"), response.headers.get("Date"), excerpt)
            raise JobFailed(f"{said}: {excerpt[:200]}")
        return excerpt

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
