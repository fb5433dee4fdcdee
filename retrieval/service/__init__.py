"""The HTTP service (``retrieval serve``). The app itself is ``retrieval.service.app`` and
needs the ``service`` extra; this package's top level imports no web framework."""

from retrieval.service.errors import (
    AuthenticationError,
    MalformedRequestError,
    NotFoundError,
    PayloadTooLargeError,
    RequestFieldError,
    RequestTimeoutError,
    ServerError,
    ServiceConfigError,
    ServiceUnavailableError,
)
from retrieval.service.settings import ServeConfig, ServerSettings, load_serve_config

__all__ = [
    "AuthenticationError",
    "MalformedRequestError",
    "NotFoundError",
    "PayloadTooLargeError",
    "RequestFieldError",
    "RequestTimeoutError",
    "ServeConfig",
    "ServerError",
    "ServerSettings",
    "ServiceConfigError",
    "ServiceUnavailableError",
    "load_serve_config",
]
