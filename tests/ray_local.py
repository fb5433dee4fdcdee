"""A local Ray cluster for one test module, stopped with the threads Ray leaves in this process.

``ray.shutdown`` leaves two daemon threads behind in the driver: Ray Serve's handle router
loop (a class-wide asyncio loop that runs for the process's life) and gRPC's asyncio poller,
whose objects sit in reference cycles until a garbage collection. A poller still alive when
the interpreter finalizes may be woken inside gRPC's C++ code and take the GIL then, which
can crash the process at exit (grpc/grpc#11804, #40447). So the router loop is stopped and
forgotten (a later module's handles start a new one), and the cycles are collected, before
the next module runs.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import ray
from ray import serve
from ray.serve._private.router import SingletonThreadRouter

_ROUTER_THREAD = "_run_router_event_loop"  # the target name in the loop thread's name


@contextmanager
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        serve.shutdown()
        ray.shutdown()
        _stop_router_loop()
        gc.collect()


def _stop_router_loop() -> None:
    loop = SingletonThreadRouter._asyncio_loop
    if loop is None:
        return
    loop.call_soon_threadsafe(loop.stop)
    for thread in threading.enumerate():
        if _ROUTER_THREAD in thread.name:
            thread.join(timeout=10)
    SingletonThreadRouter._asyncio_loop = None


def ray_threads() -> list[str]:
    """Names of the threads of Ray's making still alive in this process."""
    return [t.name for t in threading.enumerate()
            if _ROUTER_THREAD in t.name or "_poll_wrapper" in t.name]
