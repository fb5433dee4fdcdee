"""The docs a newcomer reads: the site builds with --strict (a broken link, a missing anchor or
an API reference to an object that does not exist fails it), the README stays short and its
links lead somewhere, and the benchmarks page renders from the committed figures."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import retrieval
from benchmarks import report_page

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def test_docs_site_builds_strictly(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    assert (tmp_path / "site" / "reference" / "api" / "retriever" / "index.html").is_file()


def test_readme_is_short_and_its_links_exist():
    assert len(README.read_bytes()) <= 12_000, f"README.md is {len(README.read_bytes())} bytes"
    text = README.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links, "README.md links to no docs page"
    for link in links:
        if re.match(r"[a-z]+:", link) or link.startswith("#"):
            continue
        target = (ROOT / link.split("#", 1)[0]).resolve()
        assert target.exists(), f"README.md links to {link}, which does not exist"


def test_docs_code_imports_only_exported_names():
    """As tests/test_public_api.py does for the README: what the docs import from ``retrieval``
    is in ``retrieval.__all__``."""
    for page in sorted((ROOT / "docs").rglob("*.md")):
        for block in re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S):
            imports = "\n".join(line for line in block.splitlines()
                                if line.startswith(("from ", "import ")))
            for node in ast.walk(ast.parse(imports)):
                if isinstance(node, ast.ImportFrom) and node.module == "retrieval":
                    missing = {a.name for a in node.names} - set(retrieval.__all__)
                    assert not missing, f"{page.relative_to(ROOT)} imports {missing}"


def test_benchmarks_page_renders_from_the_committed_figures():
    figures = report_page.newest(report_page.FIGURES)
    assert figures, "docs/benchmarks/figures/ holds no benchmark JSON"
    page = report_page.render(figures.values())
    for name in figures:
        assert f"## {name}\n" in page
    assert page.count("**Reproduce:**") == len(figures)
    assert "python -m benchmarks." in page
