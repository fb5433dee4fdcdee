"""The Ray Serve runtime: a deployment per shard (with replicas), a router deployment that fans
out with ``DeploymentHandle``s and answers on Serve's HTTP route. Needs the ``ray`` extra.

The router runs the same ``ShardRouter`` (validation, one encode, caches, one merge) as the
in-process runtime; only the two shard calls travel over Ray. A shard call that fails because
its replica died (or is unreachable) is sent again, and Serve routes it to another replica of
that shard; when every attempt fails within ``retry_seconds`` the search fails with
``ShardUnavailableError`` naming the shard, or, with ``allow_partial``, the other shards answer
and the result is flagged ``partial:<shard>``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from retrieval.integrations.errors import MissingExtraError

try:
    import ray
    from ray import serve
    from ray.exceptions import ActorUnavailableError, RayActorError
    from ray.serve.handle import DeploymentHandle, DeploymentResponse
    from starlette.requests import Request
    from starlette.responses import JSONResponse
except ImportError as exc:
    raise MissingExtraError("ray", "ray[data,serve]", __name__) from exc

from indexes.errors import InvalidQueryError, RetrievalError
from indexes.manifest import read_manifest
from indexes.sharding import read_layout
from retrieval.cache import make_cache
from retrieval.config import RetrieverConfig
from retrieval.loaded_build import LoadedBuild
from retrieval.models import Hit, SearchResult
from retrieval.sharding.errors import ShardUnavailableError
from retrieval.sharding.router import ShardRouter, router_encoder
from retrieval.sharding.shard import FinalHits, Shard, ShardAnswer, ShardQuery

# What a dead or unreachable replica raises; anything else (a bad request) is not retried.
REPLICA_LOST = (RayActorError, ActorUnavailableError, TimeoutError)
APP_NAME = "retrieval-shards"


@serve.deployment
class ShardReplica:
    """One replica of one shard: the shard build loaded (verified, memory-mapped) once."""

    def __init__(self, shard_dir: str, index: int, start: int, config: dict[str, Any]) -> None:
        self.config = RetrieverConfig(**config)
        snapshot = LoadedBuild.load(shard_dir, verify=self.config.verify_checksums,
                                    mmap=self.config.mmap)
        self.shard = Shard(index, snapshot, start)
        self.shard.warm_up()

    def answer(self, query: ShardQuery) -> ShardAnswer:
        return self.shard.answer(query, self.config)

    def hits(self, final: FinalHits) -> list[Hit]:
        return self.shard.hits(final)


class RayShardCalls:
    """``ShardCalls`` over Serve handles, one per shard deployment, with retries. Shards
    re-rank their own candidates (``late`` None): one round trip for the candidates."""

    late = None

    def __init__(self, handles: Sequence[DeploymentHandle], names: Sequence[str],
                 starts: Sequence[int], retry_seconds: float, timeout_seconds: float) -> None:
        self.handles = list(handles)
        self.names = list(names)
        self.starts = np.asarray(starts, dtype=np.int64)
        self.retry_seconds = retry_seconds
        self.timeout_seconds = timeout_seconds

    def answer_all(self, query: ShardQuery) -> list[ShardAnswer | ShardUnavailableError]:
        return self._gather("answer", {s: (query,) for s in range(len(self.handles))})

    def hydrate(self, final: FinalHits) -> list[Hit]:
        owners = np.searchsorted(self.starts, final.rows, side="right") - 1
        shards = np.unique(owners).tolist()
        found = self._gather("hits", {s: (final.take(np.flatnonzero(owners == s)),)
                                      for s in shards})
        for outcome in found:
            if isinstance(outcome, ShardUnavailableError):
                raise outcome  # its candidates were merged: its hits cannot be left out
        hits = {shard: iter(outcome) for shard, outcome in zip(shards, found, strict=True)}
        return [next(hits[owner]) for owner in owners.tolist()]

    def _send(self, shard: int, method: str, args: tuple[Any, ...]) -> DeploymentResponse:
        return getattr(self.handles[shard], method).remote(*args)

    def _gather(self, method: str, args: dict[int, tuple[Any, ...]]) -> list[Any]:
        """Send every call at once, then collect each, re-sending those whose replica died."""
        pending = {shard: self._send(shard, method, a) for shard, a in args.items()}
        return [self._collect(shard, method, args[shard], response)
                for shard, response in pending.items()]

    def _collect(self, shard: int, method: str, args: tuple[Any, ...],
                 response: DeploymentResponse) -> Any:
        give_up = time.monotonic() + self.retry_seconds
        while True:
            try:
                return response.result(timeout_s=self.timeout_seconds)
            except REPLICA_LOST as exc:
                if isinstance(exc, TimeoutError):
                    response.cancel()  # queued with no replica to take it: do not run it later
                if time.monotonic() >= give_up:
                    return ShardUnavailableError(
                        f"shard {self.names[shard]} has no live replica (last error: "
                        f"{type(exc).__name__}); retry later or add replicas", self.names[shard])
                time.sleep(0.05)
                response = self._send(shard, method, args)


@serve.deployment
class RouterDeployment:
    """The router: HTTP (POST JSON {query, filters, k, candidates, query_vector}) and
    ``search`` for Python callers holding its handle."""

    def __init__(self, build_dir: str, config: dict[str, Any], options: dict[str, Any],
                 *shards: DeploymentHandle) -> None:
        settings = RetrieverConfig(**config)
        manifest = read_manifest(Path(build_dir))
        _, layout = read_layout(Path(build_dir), verify=settings.verify_checksums)
        calls = RayShardCalls(shards, [e.name for e in layout.shards],
                              [e.start for e in layout.shards], options["retry_seconds"],
                              options["timeout_seconds"])
        encoder = router_encoder(manifest, settings) if options["encode"] else None
        self.router = ShardRouter(manifest, calls, settings, encoder, make_cache(settings.cache),
                                  options["allow_partial"])

    async def search(self, query: str, filters: Any = None, k: int | None = None,
                     candidates: int | None = None,
                     query_vector: np.ndarray | None = None) -> SearchResult:
        # Handles are waited on synchronously (``result``), so outside the event loop.
        return await asyncio.to_thread(self.router.search, query, filters, k,
                                       candidates=candidates, query_vector=query_vector)

    async def __call__(self, http: Request) -> JSONResponse:
        try:
            body = await http.json()
            if not isinstance(body, dict) or "query" not in body:
                raise InvalidQueryError('send a JSON object with at least "query"')
            vector = body.get("query_vector")
            result = await self.search(
                body["query"], body.get("filters"), body.get("k"), body.get("candidates"),
                None if vector is None else np.asarray(vector, dtype=np.float32))
        except ShardUnavailableError as exc:
            return JSONResponse({"error": type(exc).__name__, "detail": str(exc),
                                 "shard": exc.shard}, status_code=503)
        except (RetrievalError, ValueError) as exc:
            return JSONResponse({"error": type(exc).__name__, "detail": str(exc)},
                                status_code=400)
        return JSONResponse(result.model_dump(mode="json"))


def sharded_app(path: str | Path, config: RetrieverConfig | dict[str, Any] | None = None, *,
                replicas: int = 1, router_replicas: int = 1, allow_partial: bool = False,
                encode: bool = True, num_cpus: float = 0.0, retry_seconds: float = 10.0,
                timeout_seconds: float = 30.0) -> Any:
    """The Serve application of a sharded build (or the live one of an index root): one
    deployment ``shard-NNN`` of ``replicas`` replicas per shard, and the router.

    ``encode=False``: the router loads no encoder (callers pass ``query_vector``).
    ``num_cpus``: CPUs each replica reserves in the Ray cluster.
    """
    if not isinstance(config, RetrieverConfig):
        config = RetrieverConfig(**(config or {}))
    directory, layout = read_layout(Path(path), verify=config.verify_checksums)
    settings = config.model_dump(mode="json")
    actor = {"num_cpus": num_cpus}
    shard_deployment: Any = ShardReplica  # a serve Deployment (the stubs see the class)
    router_deployment: Any = RouterDeployment
    shards = [shard_deployment.options(name=entry.name, num_replicas=replicas,
                                   ray_actor_options=actor).bind(
                  str(layout.shard_dir(directory, i)), i, entry.start, settings)
              for i, entry in enumerate(layout.shards)]
    options = {"allow_partial": allow_partial, "encode": encode,
               "retry_seconds": retry_seconds, "timeout_seconds": timeout_seconds}
    return router_deployment.options(name="router", num_replicas=router_replicas,
                                    ray_actor_options=actor).bind(
        str(directory), settings, options, *shards)


def serve_sharded(path: str | Path, config: RetrieverConfig | dict[str, Any] | None = None, *,
                  host: str = "127.0.0.1", port: int = 8000, route_prefix: str = "/search",
                  **options: Any) -> DeploymentHandle:
    """Start Serve (HTTP on ``host:port``) in the connected Ray cluster (``ray.init`` first)
    and deploy the sharded build; returns the router's handle."""
    if not ray.is_initialized():
        raise RetrievalError("connect to a Ray cluster first: ray.init() or ray.init(ADDRESS)")
    serve.start(http_options={"host": host, "port": port})
    return serve.run(sharded_app(path, config, **options), name=APP_NAME,
                     route_prefix=route_prefix)
