"""One Redis connection model below the caches and the feature store.

Everything a request-path Redis user needs, written once:

* URL validation (``redis://`` / ``rediss://``, host, db number, Cluster's db 0) and redaction
  (a password never reaches a log line or an error message);
* client options: short socket and connect timeouts, no client-side retries (a retry doubles
  the worst case; the breaker and the next request are the retry), RESP2 without
  ``CLIENT SETINFO`` (a reconnect is a bare TCP/TLS handshake plus AUTH/SELECT), TLS files;
* lazy client creation (construction works while Redis is down; ``RedisCluster`` would
  otherwise contact the cluster in its constructor; callers share one connect attempt) and
  ``close``;
* ``call``: the fail-open call behind a ``CircuitBreaker``, with a time budget for the whole
  call (``socket_timeout_ms`` bounds each read, and a server can drip a reply read by read).
  One WARNING per outage, when the breaker opens, names the failure and, for a timeout, the
  setting to raise (``cache.socket_timeout_ms``...): on a busy host a healthy Redis can answer
  late, and that line is how an operator tells the two apart. Failures that do not open it
  are logged at INFO, once per burst;
* ``probe``: the check that tells a wrong password or an untrusted certificate (a
  ``ConfigError`` naming the redacted URL) from a server that is merely unreachable; its
  answer never closes the breaker.

The URL carries ``user:password@`` (AUTH, ACL users) and TLS (``rediss://``); query-string
options in the URL (e.g. ``?ssl_cert_reqs=none``) are passed to redis-py and take precedence.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any, Literal, NamedTuple, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from retrieval.errors import ConfigError
from retrieval.resilience.breaker import BurstLogger, CircuitBreaker

AnyRedis = redis.Redis | RedisCluster
T = TypeVar("T")
URL_SCHEMES = ("redis", "rediss")
Failure = Literal["short_circuit", "error"]


# Query options redis-py reads a secret from (``?password=...`` authenticates as well).
SECRET_OPTIONS = frozenset({"password", "ssl_password", "ssl_keyfile_password"})


def redact_url(url: str) -> str:
    """``url`` with any password, in its user part or its query, replaced by ``***`` (safe
    for logs and errors)."""
    try:
        parts = urlsplit(url)
        if parts.password is not None:
            user = parts.username or ""
            host = parts.hostname or ""
            if ":" in host:  # an IPv6 address keeps its brackets, or its port reads as a part
                host = f"[{host}]"
            netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
            parts = parts._replace(netloc=netloc)
        if parts.query:
            options = [(name, "***" if name.lower() in SECRET_OPTIONS else value)
                       for name, value in parse_qsl(parts.query, keep_blank_values=True)]
            parts = parts._replace(query=urlencode(options, safe="*"))
        return urlunsplit(parts)
    except ValueError:
        return "<unparseable url>"


def validate_redis_url(url: str, cluster: bool = False,
                       error: type[ConfigError] = ConfigError, key: str = "url") -> str:
    """Return ``url`` or raise ``error`` naming the setting ``key``."""
    shown = redact_url(url)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a non-numeric or out-of-range port
    except (ValueError, TypeError, AttributeError) as exc:
        raise error(f"{key} {shown!r} is not a valid URL: {exc}", key) from exc
    if parts.scheme not in URL_SCHEMES:
        raise error(f"{key} {shown!r} must use redis:// or rediss:// (TLS), got scheme "
                    f"{parts.scheme!r}", key)
    if not parts.hostname:
        raise error(f"{key} {shown!r} has no host; use redis://host:6379/0", key)
    db = parts.path.strip("/")
    if db and not (db.isascii() and db.isdigit()):  # "²" is a digit int() refuses
        raise error(f"{key} {shown!r}: the path must be a db number, got {db!r}", key)
    if cluster and db and int(db) != 0:
        raise error(f"{key} {shown!r}: Redis Cluster only has db 0, got db {db}", key)
    return url


class TlsFiles(NamedTuple):
    """PEM files for ``rediss://``: the CA that signed the server, and an optional client
    certificate and key (mutual TLS). None = the system trust store / no client certificate."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def options(self) -> dict[str, Any]:
        chosen = {"ssl_ca_certs": self.ca_file, "ssl_certfile": self.cert_file,
                  "ssl_keyfile": self.key_file}
        return {name: value for name, value in chosen.items() if value is not None}


NO_TLS = TlsFiles()


def make_client(url: str, cluster: bool, socket_timeout_s: float, connect_timeout_s: float,
                tls: TlsFiles = NO_TLS) -> AnyRedis:
    """A client with bounded timeouts and no client-side retries (see the module docstring)."""
    options: dict[str, Any] = {
        "socket_timeout": socket_timeout_s,
        "socket_connect_timeout": connect_timeout_s,
        "retry": Retry(NoBackoff(), 0),
        "protocol": 2,
        "driver_info": None,
        "decode_responses": False,
    }
    if urlsplit(url).scheme == "rediss":
        options.update(tls.options())
    if cluster:
        # require_full_coverage=False: serve the slots we can reach during a partial outage.
        return RedisCluster.from_url(url, require_full_coverage=False, **options)
    return redis.Redis.from_url(url, **options)


def credential_problem(exc: BaseException) -> str | None:
    """What is wrong with the credentials behind ``exc``, or None for a plain outage."""
    if isinstance(exc, redis.AuthenticationError) or "WRONGPASS" in str(exc) \
            or "NOAUTH" in str(exc):
        return "authentication failed (check the user and password in the URL)"
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLError):
            return f"TLS handshake failed ({cause}); check tls_ca_file / the server certificate"
        cause = cause.__cause__ or cause.__context__
    if "SSL" in str(exc) or "certificate" in str(exc):
        return f"TLS handshake failed ({exc}); check tls_ca_file / the server certificate"
    return None


# From ``python -m benchmarks.redis_timeouts`` (benchmarks/README.md, "Redis timeouts vs host
# load"): a loopback round trip is ~0.1 ms p50, but on a busy 2-core host its slowest calls
# took up to 39 ms (new connections 32 ms). 5 and 10 ms opened the breaker on a healthy Redis,
# 25 ms was under the slowest calls; 50 ms timed out only whole-host stalls (0.2-0.9 s), which
# 100 ms does not avoid either. Connects are rarer (after a timeout) and TLS adds round trips.
DEFAULT_SOCKET_TIMEOUT_MS = 50.0
DEFAULT_CONNECT_TIMEOUT_MS = 100.0
# A call's budget: one connect and this many socket timeouts (a call is a few round trips at
# most: a pipeline, a Cluster's MGET split per node), with room for a wait for the GIL on a
# busy host, which must not count as a slow server. 600 ms with the defaults.
CALL_BUDGET_READS = 10


class ConnectWaitError(redis.ConnectionError):
    """The client another caller was building, which this one waited for, did not come."""


class SlowAnswerError(redis.TimeoutError):
    """A call answered, but after its budget: counted as a timeout (see ``RedisLink.call``)."""

    def __init__(self, elapsed_s: float, budget_s: float) -> None:
        super().__init__(f"answered after {elapsed_s * 1000:.0f} ms, over the "
                         f"{budget_s * 1000:.0f} ms a call may take")


def timeout_setting(exc: BaseException) -> str | None:
    """The setting whose timeout ``exc`` is (``socket_timeout_ms``/``connect_timeout_ms``),
    or None when it is no timeout (refused, reset, protocol garbage). Cluster wraps the
    timeout in a ``RedisClusterException`` that keeps only its message, hence the text."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, redis.TimeoutError | TimeoutError):
        cause = cause.__cause__ or cause.__context__
    text = str(cause if cause is not None else exc)
    if "Timeout connecting" in text:
        return "connect_timeout_ms"
    if cause is not None or "Timeout reading" in text or "Timeout writing" in text:
        return "socket_timeout_ms"
    return None


class Connect:
    """One build of a link's client, shared by the callers that arrive while it runs."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.client: AnyRedis | None = None


class LinkSettings(NamedTuple):
    """How a ``RedisLink`` talks to its server (the keys of the cache and store configs)."""

    cluster: bool = False
    socket_timeout_ms: float = DEFAULT_SOCKET_TIMEOUT_MS
    connect_timeout_ms: float = DEFAULT_CONNECT_TIMEOUT_MS
    breaker_failures: int = 5
    breaker_cooldown_seconds: float = 1.0
    log_quiet_seconds: float = 60.0
    tls: TlsFiles = NO_TLS


def link_options(config: Any) -> dict[str, Any]:
    """The connection keys shared by the cache's and the feature store's configs, as the
    keyword arguments of ``RedisCache`` and ``RedisStore``: one place maps config to link."""
    return {
        "cluster": config.cluster,
        "socket_timeout_ms": config.socket_timeout_ms,
        "connect_timeout_ms": config.connect_timeout_ms,
        "breaker_failures": config.breaker_failures,
        "breaker_cooldown_seconds": config.breaker_cooldown_seconds,
        "tls": TlsFiles(config.tls_ca_file, config.tls_cert_file, config.tls_key_file),
    }


class RedisLink:
    """A lazily created request-path client behind a circuit breaker; see the module doc.

    ``what`` and ``fallback`` name the component and what it serves during an outage in its
    log lines ("feature store ... unavailable ...; serving feature defaults"); ``section`` is
    its key in the retriever config (``cache``, ``feature_store``), for the setting those
    lines name; ``error`` is the component's own ``ConfigError`` subclass.
    """

    def __init__(self, url: str, settings: LinkSettings, *, logger: logging.Logger, what: str,
                 fallback: str, section: str, error: type[ConfigError] = ConfigError) -> None:
        self.url = validate_redis_url(url, settings.cluster, error)
        self.cluster = settings.cluster
        if not (settings.socket_timeout_ms > 0 and settings.connect_timeout_ms > 0):
            raise error("socket_timeout_ms and connect_timeout_ms must be > 0")
        self.timeouts = (settings.socket_timeout_ms / 1000.0, settings.connect_timeout_ms / 1000.0)
        self.call_budget_s = self.timeouts[1] + CALL_BUDGET_READS * self.timeouts[0]
        self.tls = settings.tls
        self.breaker = CircuitBreaker(settings.breaker_failures, settings.breaker_cooldown_seconds)
        self.settings = settings
        self.what = f"{what} {redact_url(url)}"
        self.section = section
        self._fallback = fallback
        self._log = BurstLogger(logger, self.what, settings.log_quiet_seconds, fallback=fallback,
                                level=logging.INFO)
        self._logger = logger
        self._client: AnyRedis | None = None
        self._connect: Connect | None = None  # the build under way, which others wait for
        self._lock = threading.Lock()
        self.closed = False

    def client(self) -> AnyRedis:
        """The shared client, created on first use (raises ``ConnectionError`` once closed).

        Building a ``RedisCluster`` contacts the cluster. Callers arriving meanwhile wait for
        that one build (at most a call's budget) rather than queue for their own: against a
        dead cluster each used to wait its turn and then fail again (32 callers, 1.7 s). When
        it fails they raise ``ConnectWaitError``: one failed connect is one failure.
        """
        client = self._client
        if client is not None:
            return client
        with self._lock:
            if self.closed:
                raise redis.ConnectionError(f"{self.what} is closed")
            if self._client is not None:
                return self._client
            connect, mine = self._connect, self._connect is None
            if connect is None:
                connect = self._connect = Connect()
        if mine:
            return self._build(connect)
        if connect.done.wait(self.call_budget_s) and connect.client is not None:
            return connect.client
        raise ConnectWaitError(f"{self.what}: the connect this call waited for failed or "
                               "outlasted a call's budget")

    def _build(self, connect: Connect) -> AnyRedis:
        """Build the client for everyone waiting on ``connect``; a closed link keeps none."""
        client: AnyRedis | None = None
        try:
            client = make_client(self.url, self.cluster, *self.timeouts, self.tls)
        finally:
            with self._lock:
                self._connect = None  # failed or not, the next caller tries afresh
                if client is not None and not self.closed:
                    self._client = connect.client = client
            connect.done.set()
        if connect.client is None:  # closed while connecting: a closed link never reconnects
            client.close()
            raise redis.ConnectionError(f"{self.what} is closed")
        return client

    def allow(self) -> bool:
        """May a call go out now (not closed, breaker not open)? True must be followed by
        ``succeeded`` or ``failed``."""
        return not self.closed and self.breaker.allow()

    def succeeded(self) -> None:
        self.breaker.record_success()
        self._log.success()

    def failed(self, exc: BaseException, fallback: str | None = None) -> None:
        """Count a failure; ``fallback`` says what was served when it is not the usual."""
        if self.breaker.record_failure():  # closed -> open: the one WARNING of this outage
            self._logger.warning("%s", self.opened_message(exc))
            self._log.logged_elsewhere()
        else:
            self._log.error(exc, fallback)

    def opened_message(self, exc: BaseException) -> str:
        """The breaker-open line: component, failure, how long it is skipped, what to raise."""
        setting = timeout_setting(exc)
        if setting is None:
            failure = f"{type(exc).__name__}: {exc}"
            hint = "not a timeout: check that Redis is up and reachable"
        else:
            ms = float(getattr(self.settings, setting))
            failure = f"{'connect ' * (setting == 'connect_timeout_ms')}timeout after {ms:.1f} ms"
            if isinstance(exc, SlowAnswerError):  # its budget grows with socket_timeout_ms
                failure = f"slow answer: {exc}"
            hint = (f"if Redis is healthy but the host is busy, raise {self.section}.{setting} "
                    f"(now {ms:.1f})")
        failures = self.breaker.failures_to_open
        return (f"{self.what} unavailable ({failure}, {failures} failure{'s' * (failures > 1)} "
                f"in a row): {self._fallback} for {self.breaker.cooldown_seconds:.1f} s, then "
                f"probing again; {hint}")

    def call(self, fn: Callable[[AnyRedis], T], on_failure: Callable[[Failure], T]) -> T:
        """``fn(client)``, or ``on_failure(...)`` when the breaker is open or the call fails.

        Never raises for Redis trouble (timeouts, refused connections, protocol garbage);
        ``BaseException`` (KeyboardInterrupt) still propagates, after closing a probe. A call
        whose wait for another's connect was in vain is short-circuited, uncounted.

        ``call_budget_s`` bounds the whole call as the socket timeout bounds one read: a server
        that drips its reply is waited on read after read. A call answered past its budget
        counts as a timeout failure, so a server that stays that slow opens the breaker, but
        its value is used: it is correct, and the wait is already paid.
        """
        if not self.allow():
            return on_failure("short_circuit")
        try:
            client = self.client()
            started = time.monotonic()
            value = fn(client)
        except ConnectWaitError:
            self.breaker.record_skip()
            return on_failure("short_circuit")
        except Exception as exc:
            self.failed(exc)
            return on_failure("error")
        except BaseException:
            self.breaker.record_failure()  # never leave a half-open probe dangling
            raise
        elapsed = time.monotonic() - started
        if elapsed > self.call_budget_s:
            self.failed(SlowAnswerError(elapsed, self.call_budget_s),
                        "its answer was used, counted as a timeout")
        else:
            self.succeeded()
        return value

    def probe(self) -> bool:
        """PING once: True if answered, False if unreachable (a failure, logged once).

        A wrong password or an untrusted certificate is not an outage but a configuration
        mistake: it raises ``ConfigError`` naming the redacted URL.

        An answer never closes the breaker nor clears its failures, and a breaker that is not
        closed answers False without a PING: a Cluster's PING reaches its default node, not the
        node holding the data, and ``FeatureStage`` probes every refresh period, so a PING
        would end every cool-down early. Only a call (the half-open one) ends an outage.
        """
        if self.breaker.state != "closed":
            return False
        try:
            self.client().ping()
        except ConnectWaitError:
            return False  # another caller's connect did not come; it counts its own failure
        except Exception as exc:
            problem = credential_problem(exc)
            if problem is not None:
                raise ConfigError(f"{self.what}: {problem}", "url") from exc
            self.failed(exc)
            return False
        return True

    def stats(self) -> dict[str, object]:
        return self.breaker.stats()

    def close(self) -> None:
        """Close the connections; later calls fail open (a closed link never reconnects)."""
        with self._lock:
            self.closed = True
            client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception as exc:  # closing a dead connection is not worth an error
                self._logger.debug("closing %s failed: %s", self.what, exc)
