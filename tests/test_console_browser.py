"""The console end to end in a real headless browser: Debian's chromium driven by Playwright
against a real ``retrieval serve`` over a two-build root of shipped Cranfield documents.

A query typed with a filter shows the hits ``/v1/search`` returns; a hit's explanation shows
the library's numbers; comparing the live build with the staged one shows the gate's
overlap@k; the gate over a query file shows the gate's verdict; the page fits a phone's width.
Any JavaScript error, console error or failed request fails the test. Each view is
screenshotted (into ``CONSOLE_SCREENSHOTS`` when set, else the test's temporary folder).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from console_index import console_root
from playwright.sync_api import Page, sync_playwright
from serving import Serving, serve
from small_index import query_encoder_fixture  # noqa: F401 (fixture)

from indexes.publish import build_dir
from retrieval import Retriever, RetrieverConfig
from retrieval.publishing.config import Canary, GateConfig
from retrieval.publishing.gate import SearchInputs, compare_builds
from retrieval.publishing.quality import overlap_at_k

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
QUERY = "heat transfer in hypersonic flow"
CANARIES = [{"query": QUERY, "expected": ["1"]}, {"query": "buckling of cylindrical shells"}]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, dataset: Any, encoder: Any
         ) -> Iterator[tuple[Serving, Path, str, str]]:
    base = tmp_path_factory.mktemp("console")
    live, staged = console_root(base / "index", dataset("cranfield"), encoder)
    config = base / "serve.toml"
    config.write_text("[server]\ndrain_seconds = 0.1\n")
    server = serve(base / "index", config, base / "server.log", {})
    try:
        server.wait_until(lambda: server.client(None).get("/readyz").status_code == 200, 300,
                          "the service to be ready")
        yield server, base / "index", live, staged
    finally:
        server.stop()


class Watched:
    """A page whose JavaScript errors, console errors and failed requests are collected."""

    def __init__(self, page: Page, shots: Path) -> None:
        self.page = page
        self.shots = shots
        self.problems: list[str] = []
        page.on("pageerror", lambda error: self.problems.append(f"page error: {error}"))
        page.on("console", lambda m: self.problems.append(f"console {m.type}: {m.text}")
                if m.type in ("error", "warning") else None)
        page.on("response", lambda r: self.problems.append(f"HTTP {r.status} {r.url}")
                if r.status >= 400 else None)
        page.on("requestfailed", lambda r: self.problems.append(f"failed: {r.url}"))

    def check(self, view: str) -> None:
        """No problem so far, no error banner; a screenshot of the view."""
        assert not self.problems, self.problems
        assert self.page.locator("#error").is_hidden(), self.page.text_content("#error")
        path = self.shots / f"console-{view}.png"
        self.page.screenshot(path=str(path), full_page=True)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.fixture()
def watched(site: Any, tmp_path: Path) -> Iterator[Watched]:
    shots = Path(os.environ.get("CONSOLE_SCREENSHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(60_000)
            page.goto(f"{site[0].url}/console")
            page.wait_for_selector("body[data-ready=true]")
            yield Watched(page, shots)
        finally:
            browser.close()


def dom_hits(page: Page, selector: str = "#hits > li") -> list[tuple[str, float]]:
    return [(item.get_attribute("data-doc-id") or "",
             float(item.locator(".score").get_attribute("data-score") or "nan"))
            for item in page.locator(selector).all()]


def test_search_with_a_filter_shows_the_services_hits_and_the_librarys_explanation(
        site, watched, query_encoder):
    server, root, _, _ = site
    page = watched.page
    page.keyboard.press("/")  # the keyboard way in
    assert page.evaluate("document.activeElement.id") == "q"
    page.keyboard.type(QUERY)
    page.select_option("#fk-tags", ["heat"])
    page.select_option("#fm-tags", "all")
    page.press("#q", "Enter")
    page.wait_for_selector("#hits > li")
    filters = {"tags": {"all": ["heat"]}}
    with server.client(None) as client:
        expected = client.post("/v1/search", json={"query": QUERY, "filters": filters,
                                                   "explain": True}).json()
    assert dom_hits(page) == [(h["doc_id"], h["score"]) for h in expected["hits"]]
    assert page.locator("#timings li[data-stage=total]").count() == 1
    assert "cache: result" in page.text_content("#search-summary")
    watched.check("search")

    page.click("#hits > li:first-child details.why summary")
    page.wait_for_selector("#hits > li:first-child details.why td[data-field]")
    why = page.locator("#hits > li:first-child details.why")
    shown = {cell.get_attribute("data-field"): float(cell.get_attribute("data-value") or "nan")
             for cell in why.locator("td[data-field]").all()}
    terms = {cell.get_attribute("data-term"): float(cell.get_attribute("data-value") or "nan")
             for cell in why.locator("td[data-term]").all()}
    with Retriever.load(root, RetrieverConfig(), encoder=query_encoder) as library:
        top = library.search(QUERY, filters, explain=True).hits[0]
    assert top.explanation is not None and top.doc_id == expected["hits"][0]["doc_id"]
    numbers = {"score": top.score, "fused": top.explanation.fused, "bm25": top.explanation.bm25,
               "vector": top.explanation.vector, "features": top.explanation.features,
               "coverage": top.explanation.coverage}
    if top.relevance is not None:
        numbers["relevance"] = top.relevance
    assert shown == pytest.approx(numbers, abs=1e-5)
    assert terms == pytest.approx(top.explanation.bm25_terms, abs=1e-6)
    assert f"rank {top.explanation.bm25_rank} of" in why.text_content()
    watched.check("explanation")


def test_comparing_the_live_build_with_the_staged_one_shows_the_gates_overlap(
        site, watched, query_encoder):
    _, root, live, staged = site
    page = watched.page
    page.focus("#tab-search")
    page.keyboard.press("ArrowRight")  # tabs move with the arrow keys
    assert page.get_attribute("#tab-compare", "aria-selected") == "true"
    page.fill("#q", QUERY)
    page.select_option("#right-build", staged)
    page.click("#run")
    page.wait_for_selector("#overlap")
    with Retriever.load(root, RetrieverConfig(), encoder=query_encoder) as left, \
            Retriever.load(build_dir(root, staged), RetrieverConfig(),
                           encoder=query_encoder) as right:
        ids = [[h.doc_id for h in r.search(QUERY, k=10).hits] for r in (left, right)]
    assert float(page.get_attribute("#overlap", "data-value") or "nan") == overlap_at_k(
        ids[0], ids[1], 10)
    assert [i.get_attribute("data-doc-id") for i in page.locator("#right-hits > li").all()] \
        == ids[1]
    assert page.locator("#left-hits li.changed").count() == len(set(ids[0]) - set(ids[1]))
    watched.check("compare")

    page.click("#tab-gate")
    page.fill("#gate-queries", "\n".join(json.dumps(c) for c in CANARIES))
    page.fill("#gate-k", "5")
    page.click("#gate-run")
    page.wait_for_selector("#gate-verdict")
    with Retriever.load(root, RetrieverConfig(), encoder=query_encoder) as serving:
        report = compare_builds(
            build_dir(root, live), build_dir(root, staged), GateConfig(k=5),
            encoder=serving.encoder, config=serving.config,
            inputs=SearchInputs([Canary(**c) for c in CANARIES], []))
    verdict = "passed" if report.passed else "refused by: " + ", ".join(
        c.name for c in report.refused)
    assert page.text_content("#gate-verdict") == verdict
    for check in report.checks:
        row = page.locator(f"#gate-report tr[data-check='{check.name}'] td")
        assert row.nth(1).text_content() == check.outcome
        assert row.nth(2).text_content() == check.summary
    watched.check("gate")


def test_the_console_fits_a_phone(site, watched):
    page = watched.page
    page.set_viewport_size({"width": 390, "height": 844})
    page.fill("#q", QUERY)
    page.press("#q", "Enter")
    page.wait_for_selector("#hits > li")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    page.click("#tab-compare")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    watched.check("phone")
