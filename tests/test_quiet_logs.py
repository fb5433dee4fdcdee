"""Quiet logs by default: a build from the command line shows our own progress and summary,
not third-party chatter (faiss probing instruction sets, the model's weight-loading bar)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

from retrieval.quiet import CHATTY, quiet_third_party

REPO = Path(__file__).resolve().parents[1]


def test_a_cli_build_prints_only_our_own_lines(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"_id": "a", "text": "wing flutter"}\n{"_id": "b", "text": "shocks"}\n')
    done = subprocess.run(
        [sys.executable, "-m", "retrieval", "build", "--corpus", str(corpus), "--out",
         str(tmp_path / "idx")], cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr
    noise = [line for line in done.stderr.splitlines()
             if "faiss" in line.lower() or "Loading weights" in line or "WARNING" in line]
    assert noise == [], noise
    assert "published build" in done.stdout


def test_quiet_third_party_keeps_their_info_lines_out():
    quiet_third_party()
    assert all(logging.getLogger(name).getEffectiveLevel() >= logging.WARNING
               for name in CHATTY)
    assert logging.getLogger("retrieval").getEffectiveLevel() <= logging.WARNING
