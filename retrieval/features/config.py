"""Feature-store configuration (pydantic) and the factory that opens a store from it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from retrieval.cache.base import MAX_TTL_SECONDS, check_ttl
from retrieval.cache.keys import validate_namespace
from retrieval.cache.redis_backend import refuse_decoded_replies
from retrieval.features.errors import FeatureConfigError
from retrieval.features.local import LocalStore
from retrieval.features.redis_store import (
    DEFAULT_CONNECT_TIMEOUT_MS,
    DEFAULT_KEY_TTL_SECONDS,
    DEFAULT_SLOT_MOVE_WAIT_SECONDS,
    DEFAULT_SOCKET_TIMEOUT_MS,
    RedisStore,
)
from retrieval.features.store import DEFAULT_GRACE_SECONDS, OnlineStore
from retrieval.resilience import link_options, redact_url, validate_redis_url

REDIS_SCHEMES = ("redis://", "rediss://")


def is_redis_location(location: str) -> bool:
    return location.lower().startswith(REDIS_SCHEMES)


class FeatureStoreConfig(BaseModel):
    """Where features live: a ``redis://``/``rediss://`` URL, or else a local directory."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # repr=False: a URL may carry a password and configs end up in logs.
    location: str = Field(min_length=1, repr=False)
    cluster: bool = False
    namespace: str = "retrieval"
    grace_seconds: float = Field(DEFAULT_GRACE_SECONDS, ge=0, allow_inf_nan=False)
    key_ttl_seconds: float = Field(
        DEFAULT_KEY_TTL_SECONDS, ge=60, allow_inf_nan=False, description=f"seconds, at most "
        f"{MAX_TTL_SECONDS:.0e}: the longest expiry Redis accepts")
    socket_timeout_ms: float = Field(DEFAULT_SOCKET_TIMEOUT_MS, gt=0, le=60_000)
    connect_timeout_ms: float = Field(DEFAULT_CONNECT_TIMEOUT_MS, gt=0, le=60_000)
    breaker_failures: int = Field(5, ge=1)
    breaker_cooldown_seconds: float = Field(1.0, gt=0, allow_inf_nan=False)
    slot_move_wait_seconds: float = Field(
        DEFAULT_SLOT_MOVE_WAIT_SECONDS, gt=0, allow_inf_nan=False, description="Cluster: how "
        "long a materialization waits for a reshard moving its view's slot to end before it "
        "fails (the previous snapshot stays live)")
    tls_ca_file: str | None = Field(None, description="rediss://: PEM of the CA that signed "
                                    "the server (None = system trust store)")
    tls_cert_file: str | None = Field(None, description="rediss://: client certificate (mTLS)")
    tls_key_file: str | None = Field(None, description="rediss://: client key (mTLS)")

    @field_validator("namespace")
    @classmethod
    def _check_namespace(cls, value: str) -> str:
        return validate_namespace(value)  # as the cache's: braces would break Cluster slots

    # Refused here, at load, as the cache's settings are (``retrieval.cache.config``), rather
    # than only when the store is built: a longer TTL failed every materialization, and
    # decoded replies failed every read.
    @field_validator("location")
    @classmethod
    def _check_decoded_replies(cls, value: str) -> str:
        if is_redis_location(value):
            refuse_decoded_replies(value, FeatureConfigError, "location")
        return value

    @field_validator("key_ttl_seconds")
    @classmethod
    def _check_key_ttl(cls, value: float) -> float:
        return check_ttl(value, "key_ttl_seconds", FeatureConfigError)

    @model_validator(mode="after")
    def _check_location(self) -> FeatureStoreConfig:
        if is_redis_location(self.location):
            validate_redis_url(self.location, self.cluster)
        elif self.cluster:
            raise ValueError("cluster=True needs a redis:// or rediss:// location")
        return self

    def describe(self) -> str:
        """One-line, password-free summary for logs."""
        return f"feature store {redact_url(self.location)} cluster={self.cluster}"


def make_store(config: FeatureStoreConfig) -> OnlineStore:
    """The store ``config`` describes: ``RedisStore`` for a Redis URL, else ``LocalStore``."""
    if not is_redis_location(config.location):
        return LocalStore(config.location, grace_seconds=config.grace_seconds)
    return RedisStore(config.location, namespace=config.namespace,
                      grace_seconds=config.grace_seconds,
                      key_ttl_seconds=config.key_ttl_seconds,
                      slot_move_wait_seconds=config.slot_move_wait_seconds, **link_options(config))
