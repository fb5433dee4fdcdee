"""The root parser, the list of subcommands and the error boundary of the command line."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from pydantic import ValidationError

from indexes.errors import RetrievalError
from retrieval.cli import (
    admin,
    build,
    calibrate,
    compact,
    delete,
    demo,
    describe,
    distill,
    features,
    publish,
    search,
    serve,
    snapshot,
    upsert,
)
from retrieval.cli.common import Subparsers, flag_problems
from retrieval.quiet import quiet_third_party

# Each entry adds one subcommand (or a small group) to the root parser, in --help order.
COMMANDS: tuple[Callable[[Subparsers], object], ...] = (
    build.register,
    admin.register_verify,
    admin.register_gc,
    describe.register,
    search.register,
    calibrate.register,
    distill.register,
    upsert.register,
    delete.register,
    compact.register,
    snapshot.register_snapshot,
    snapshot.register_restore,
    features.register,
    publish.register,
    serve.register,
    demo.register,
)

DESCRIPTION = """Build, inspect and search retrieval indexes.

Benchmarks have their own entry point: python -m benchmarks.suite (or retrieval-bench)."""


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="retrieval", description=DESCRIPTION,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    subparsers = root.add_subparsers(dest="command", required=True)
    for register in COMMANDS:
        register(subparsers)
    return root


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    quiet_third_party()
    args = parser().parse_args(argv)
    if getattr(args, "own_signals", False):
        return _run(args)
    with terminated_as_exit():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe fails here, not in the interpreter's exit
        return code
    except RetrievalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ValidationError as exc:  # a flag's value a setting refuses
        print(f"error: invalid {exc.title} settings: {flag_problems(exc)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `retrieval builds ROOT | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 141
    except OSError as exc:  # a path missing, taken or not ours to write
        print(f"error: {describe_os_error(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the shell's code for SIGINT: not 1 (a gate's refusal)
        print("interrupted", file=sys.stderr)
        return 130


@contextmanager
def terminated_as_exit() -> Iterator[None]:
    """SIGTERM (a container stopped, a job killed) exits 143 through the command's own
    cleanup: a snapshot's or restore's temporary copy, a staged build, a lock. Python's
    default ends the process at once and leaves them. ``serve`` has its own handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _exit_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _exit_terminated(signum: int, frame: object) -> None:
    print("terminated", file=sys.stderr)
    raise SystemExit(143)


def describe_os_error(exc: OSError) -> str:
    """``No such file or directory: 'x/queries.jsonl'``, without errno's bracket."""
    if exc.strerror and exc.filename is not None:
        return f"{exc.strerror}: {str(exc.filename)!r}"
    return str(exc)
