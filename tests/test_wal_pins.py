"""Build pins of the write-ahead log (``indexes.wal.seal``): a pin keeps the records after its
seq while its build runs; a pin whose build was killed must not hold the log for days."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from indexes.wal.log import wal_dir
from indexes.wal.seal import PINS, ProcessId, pin, pinned

PINNER = """
import sys, time
from pathlib import Path
from indexes.wal.seal import pin
print(pin(Path(sys.argv[1]), int(sys.argv[2])), flush=True)
time.sleep(600)
"""


def pinning_process(root, seq):
    """A process that pins ``root`` at ``seq`` and stays alive; (process, pin path)."""
    proc = subprocess.Popen([sys.executable, "-c", PINNER, str(root), str(seq)],
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})
    return proc, proc.stdout.readline().strip()


def test_a_killed_builds_pin_is_dropped_while_a_running_ones_is_kept(tmp_path):
    """A build killed mid-run (OOM, a deploy) never unpins: its pin held every segment
    after its seq for 7 days (12 stale pins held 117 segments after a kill test). The pin
    names its process, so the next compaction on the same machine drops it."""
    killed, killed_pin = pinning_process(tmp_path, 5)
    running, _ = pinning_process(tmp_path, 9)
    try:
        assert sorted(pinned(tmp_path)) == [5, 9]
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        assert pinned(tmp_path) == [9]
        assert not os.path.exists(killed_pin)  # deleted, not only ignored
    finally:
        for proc in (killed, running):
            proc.kill()
            proc.wait()
            proc.stdout.close()


def test_pins_no_process_here_can_judge_are_kept_until_they_age(tmp_path):
    """Another machine's build (a Ray driver on a shared volume), another container's, or a
    pin written before pins named their process: its owner cannot be checked from here, so
    only age retires it."""
    pins = wal_dir(tmp_path) / PINS
    pins.mkdir(parents=True)
    own = ProcessId.own().as_json()
    (pins / f"3.1.{time.time_ns()}").write_text(json.dumps({**own, "boot": "another-boot",
                                                            "pid": 1 << 30}))
    (pins / f"4.1.{time.time_ns()}").write_text(json.dumps({**own, "namespace": "pid:[1]",
                                                            "pid": 1 << 30}))
    (pins / f"6.1.{time.time_ns()}").touch()  # the old format: empty
    (pins / f"7.1.{time.time_ns()}").write_text("{not json")
    (pins / f"8.1.{time.time_ns()}").write_bytes(b"\xff\xfe not text")
    (pins / f"9.1.{time.time_ns()}").write_text(json.dumps({**own, "pid": 0}))  # no pid
    assert sorted(pinned(tmp_path)) == [3, 4, 6, 7, 8, 9]
    old = time.time() - 8 * 24 * 3600
    for path in pins.iterdir():
        os.utime(path, (old, old))
    assert pinned(tmp_path) == []


def test_a_pid_reused_by_a_later_process_does_not_keep_a_dead_pin(tmp_path):
    """The pid alone would keep the pin of a build whose pid a later process took: the pin
    also holds when its process started."""
    path = pin(tmp_path, 2)
    assert pinned(tmp_path) == [2]  # this process is alive
    owner = json.loads(path.read_text())
    path.write_text(json.dumps({**owner, "started": "1"}))  # this pid, an earlier process
    assert pinned(tmp_path) == []
