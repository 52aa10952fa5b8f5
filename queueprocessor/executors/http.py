"""HTTP jobs: a GET or POST to a path on the node's own web server (the seeds' jobs are pages),
or to an absolute URL on a host in the node's allow-list (default: this machine only).

The fence token travels in X-QP-Fence so the downstream service can refuse a
writer that lost its lease. A POST sends the payload as its JSON body; a GET sends
it as query parameters, which only a flat JSON object of scalars can be (see
query_of): any other payload fails the run at once, with the reason.
"""

import json
import logging
import sys
from urllib.parse import urljoin, urlsplit, urlunsplit

import httpx

from ..errors import InvalidJob
from ..store import Claimed, JobSpec
from .base import Executor, JobContext, JobFailed

METHODS = ("GET", "POST")
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
# Requests are spread over a few clients: one httpx client's connection pool slows down sharply with many
# requests in flight (encode/httpx#3215; 32 at once to a local server: about 320 requests/s through one
# client, 750 through eight).
CLIENTS = 8
RESOLVED_KEPT = 4096  # targets whose URL a node remembers (see HttpExecutor.resolve)

# httpcore asks `import sniffio` which event loop it runs under, several times per request; sniffio is optional
# (anyio 4 no longer installs it), and where it is missing each of those imports searched sys.path again and
# failed: a sixth of a node's CPU per HTTP job. Its absence, recorded once, makes the answer instant.
try:
    import sniffio  # noqa: F401
except ImportError:
    sys.modules.setdefault("sniffio", None)

# httpx logs every request at INFO ("HTTP Request: GET ... 200 OK"): at the INFO level a node runs at, a busy
# node wrote a line per job (4% of its CPU on HTTP jobs), burying its own log. A failure is logged by the runner.
logging.getLogger("httpx").setLevel(logging.WARNING)


def check_syntax(spec: JobSpec) -> str | None:
    """A path relative to the node's --http-base, or an absolute http(s) URL: returns its host (None if relative)."""
    if spec.method not in METHODS:
        raise InvalidJob(f"HTTP method {spec.method!r} is not supported: use GET or POST")
    parts = _split(spec.target, f"HTTP job target {spec.target!r}")
    if not (parts.scheme or parts.netloc or spec.target.startswith("//")):
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidJob(f"HTTP job target {spec.target!r} is neither a path such as /reports/run nor an "
                         "http(s) URL")
    return parts.hostname


def _split(url: str, what: str):
    try:
        return urlsplit(url)
    except ValueError as error:  # e.g. "[::1" or a host that NFKC normalisation would change
        raise InvalidJob(f"{what} is not a valid URL ({error})") from None


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
        raise JobFailed(f"a GET sends its payload as query parameters, so it must be a flat JSON object such as "
                        f'{{"day": "2026-11-22"}}, not {payload[:80]}: use POST to send it as a JSON body',
                        permanent=True)
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in data.items()}


class HttpExecutor(Executor):
    name = "http"

    def __init__(self, base_url: str = "http://localhost/", allowed_hosts: tuple[str, ...] = LOCAL_HOSTS):
        parts = _split(base_url, f"--http-base {base_url!r}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidJob(f"--http-base {base_url!r} is not an http(s) URL, e.g. http://localhost:8080/")
        if parts.hostname not in allowed_hosts:
            raise InvalidJob(f"--http-base host {parts.hostname!r} is not in the allowed hosts {', '.join(allowed_hosts)}")
        self.base_url = base_url if base_url.endswith("/") else base_url + "/"
        self.allowed_hosts = tuple(allowed_hosts)
        self._clients: list[httpx.AsyncClient] = []
        self._resolved: dict[tuple[str, str], str] = {}  # (method, target) -> URL, allowed (see resolve)

    def validate(self, spec: JobSpec) -> None:
        host = check_syntax(spec)
        if host is not None and host not in self.allowed_hosts:
            raise InvalidJob(f"HTTP job target {spec.target!r}: host {host!r} is not allowed on this machine; "
                             f"allowed hosts: {', '.join(self.allowed_hosts)} (add one with --allow-host)")

    def url_for(self, target: str) -> str:
        parts = urlsplit(target)
        if parts.scheme:  # an absolute URL on an allowed host (see validate), sent as validate read it
            return urlunsplit(parts)
        # "./" keeps a path a path: joined bare, "/http://elsewhere/x" would become that other URL.
        return urljoin(self.base_url, "./" + target.lstrip("/"))

    def resolve(self, method: str, target: str) -> str:
        """The URL a job's target names, once it is known to be allowed (else InvalidJob or a permanent JobFailed).
        Remembered per target: a farm sends the same few targets thousands of times, and parsing each three
        times cost more than the request's own header building."""
        key = (method, target)
        url = self._resolved.get(key)
        if url is None:
            self.validate(JobSpec(executor=self.name, target=target, method=method))
            url = self.url_for(target)
            try:  # checked again as the HTTP client itself reads it, so no two parsers can disagree on the host
                host = httpx.URL(url).host
            except httpx.InvalidURL as error:
                raise JobFailed(f"{method} {url}: not a valid URL ({error})", permanent=True) from None
            if host not in self.allowed_hosts:
                raise JobFailed(f"{method} {url}: host {host!r} is not allowed on this machine", permanent=True)
            if len(self._resolved) >= RESOLVED_KEPT:
                self._resolved.clear()
            self._resolved[key] = url
        return url

    async def run(self, job: Claimed, context: JobContext) -> str | None:
        url = self.resolve(job.method, job.target)
        if not self._clients:
            self._clients = [httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0)) for _ in range(CLIENTS)]
        headers = {
            "X-QP-Job": str(job.id),
            "X-QP-Attempt": str(job.attempts),
            "X-QP-Fence": str(job.fence),
            "X-QP-Machine": str(context.machine_id),
        }
        body = job.payload.encode() if job.method == "POST" and job.payload is not None else None
        if body is not None:
            headers["Content-Type"] = "application/json"
        params = query_of(job.payload) if job.method == "GET" else None
        try:
            response = await self._clients[job.id % CLIENTS].request(job.method, url, headers=headers, content=body,
                                                                     params=params)
        except httpx.HTTPError as error:
            raise JobFailed(f"{job.method} {url}: {type(error).__name__}: {error}") from None
        excerpt = response.text[:500]
        if not response.is_success:
            raise JobFailed(f"{job.method} {url} answered HTTP {response.status_code}: {excerpt[:200]}")
        return excerpt

    async def close(self) -> None:
        for client in self._clients:
            await client.aclose()
        self._clients = []
