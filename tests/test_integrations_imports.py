"""The frameworks stay optional: ``import retrieval`` never loads them, and an adapter whose
extra is missing says which pip command installs it. Each case runs in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FRAMEWORKS = ("langchain", "langchain_core", "llama_index", "ray")


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(REPO),
                                            "HF_HUB_OFFLINE": "1"})


def test_import_retrieval_loads_no_framework():
    done = run("import sys, retrieval, retrieval.integrations, retrieval.sharding\n"
               f"print(sorted(m for m in sys.modules if m.split('.')[0] in {FRAMEWORKS!r}))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(("module", "blocked", "extra"), [
    ("langchain", "langchain_core", "langchain"),
    ("llamaindex", "llama_index", "llamaindex"),
    ("llamaindex_filters", "llama_index", "llamaindex"),
])
def test_missing_extra_names_the_pip_command(module, blocked, extra):
    # sys.modules[name] = None makes ``import name`` fail as if the package were not installed.
    done = run(f"import sys; sys.modules[{blocked!r}] = None\n"
               "from retrieval.integrations import MissingExtraError\n"
               "from retrieval import RetrievalError\n"
               "try:\n"
               f"    import retrieval.integrations.{module}\n"
               "except MissingExtraError as exc:\n"
               "    assert isinstance(exc, (RetrievalError, ImportError))\n"
               "    print(exc)\n")
    assert done.returncode == 0, done.stderr
    assert f"pip install 'retrieval[{extra}]'" in done.stdout


def test_ray_serve_without_the_ray_extra_names_the_pip_command():
    done = run("import sys; sys.modules['ray'] = None\n"
               "from retrieval.integrations import MissingExtraError\n"
               "try:\n"
               "    import retrieval.sharding.ray_serve\n"
               "except MissingExtraError as exc:\n"
               "    print(exc)\n")
    assert done.returncode == 0, done.stderr
    assert "retrieval.sharding.ray_serve needs ray" in done.stdout
    assert "pip install 'retrieval[ray]'" in done.stdout
