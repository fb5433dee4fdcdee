"""The console's API against the library: its schema is ``retrieval describe``'s, a side is
``Retriever.with_ranking`` or another build loaded as serving loads it, a comparison's overlap
is the gate's, and the gate report is ``compare_builds``'. Who may use it, and bad requests.

The real app runs in this process (Starlette's test client runs its lifespan) over a real
two-build root of shipped Cranfield documents.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from console_index import STAGED_DOCS, console_root
from small_index import query_encoder_fixture  # noqa: F401 (fixture)
from starlette.requests import Request
from starlette.routing import Route
from starlette.testclient import TestClient

from indexes.field_summary import summarize_fields
from indexes.publish import build_dir
from retrieval import Retriever, RetrieverConfig
from retrieval.compare import compare_results
from retrieval.console.routes import FieldSummaries
from retrieval.errors import ConfigError
from retrieval.publishing.config import Canary, GateConfig
from retrieval.publishing.gate import SearchInputs, compare_builds
from retrieval.publishing.quality import overlap_at_k
from retrieval.service.app import create_app
from retrieval.service.auth import ApiKeys
from retrieval.service.settings import ServeConfig, ServerSettings

QUERY = "heat transfer in hypersonic flow"
FILTERS = {"tags": {"any": ["heat", "flow"]}}
READ_KEY, ADMIN_KEY = "read-key-0123456789", "admin-key-0123456789"


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory: pytest.TempPathFactory, dataset: Any, encoder: Any
               ) -> tuple[Path, str, str]:
    root = tmp_path_factory.mktemp("console-api") / "index"
    live, staged = console_root(root, dataset("cranfield"), encoder)
    return root, live, staged


@pytest.fixture(scope="module")
def serving(two_builds: tuple[Path, str, str], query_encoder: Any) -> Iterator[Retriever]:
    with Retriever.load(two_builds[0], RetrieverConfig(), encoder=query_encoder) as retriever:
        yield retriever


def app_client(root: Path, serving: Retriever, keys: ApiKeys | None = None,
               **server: Any) -> TestClient:
    config = ServeConfig(server=ServerSettings(**server))
    app = create_app(root, config, keys=keys or ApiKeys([]), loader=lambda: serving)
    return TestClient(app, base_url="http://127.0.0.1")


def wait_ready(client: TestClient) -> None:
    deadline = time.monotonic() + 60
    while client.get("/readyz").status_code != 200:
        assert time.monotonic() < deadline, "the service never became ready"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def other_build(tmp_path_factory: pytest.TempPathFactory, dataset: Any, encoder: Any
                ) -> tuple[Path, str]:
    """(directory, id) of a build of another index on the same machine."""
    root = tmp_path_factory.mktemp("elsewhere") / "index"
    live, _ = console_root(root, dataset("cranfield"), encoder)
    return root / "builds" / live, live


@pytest.fixture(scope="module")
def client(two_builds: tuple[Path, str, str], serving: Retriever) -> Iterator[TestClient]:
    with app_client(two_builds[0], serving) as test_client:
        wait_ready(test_client)
        yield test_client


def test_the_schema_is_what_describe_knows_with_the_builds(client, serving, two_builds):
    _, live, staged = two_builds
    schema = client.get("/v1/console/schema").json()
    expected = {f.name: f.as_dict() for f in summarize_fields(serving.snapshot.metadata, 20)}
    assert schema["fields"] == expected
    assert schema["fields"]["tags"]["multi_valued"] is True
    assert schema["fields"]["department"]["multi_valued"] is False
    assert schema["fields"]["published"] == {"kind": "date", "documents": 150, "of": 150,
                                             "min": "1950-01-01T00:00:00Z",
                                             "max": "1969-08-01T00:00:00Z"}
    assert schema["ranking"]["fusion"] == serving.config.fusion and not schema["passages"]
    builds = {b["build_id"]: b for b in schema["builds"]}
    assert builds[live]["serving"] and builds[live]["status"] == "live"
    assert builds[staged]["status"] == "staged" and builds[staged]["documents"] == STAGED_DOCS


def test_the_schema_is_summarized_off_the_event_loop(client):
    """Summarizing every field (86-252 ms for an id-like field of 100k documents) ran on the
    event loop, which answered nothing meanwhile, not even /healthz."""
    (route,) = [r for r in client.app.routes
                if isinstance(r, Route) and r.path == "/v1/console/schema"]
    request = Request({"type": "http", "method": "GET", "path": route.path, "headers": [],
                       "query_string": b""})

    async def answer() -> tuple[bool, bytes]:
        schema = asyncio.create_task(route.endpoint(request))
        await asyncio.sleep(0)  # one step of the handler: it hands the summary to a thread
        yielded = not schema.done()
        return yielded, (await schema).body

    yielded, body = asyncio.run(answer())
    assert yielded, "the schema was computed on the event loop"
    assert json.loads(body) == client.get("/v1/console/schema").json()


def test_the_field_summary_is_computed_once_per_snapshot(serving, two_builds):
    root, _, staged = two_builds
    summaries = FieldSummaries()
    fields = summaries.of(serving.snapshot)
    assert summaries.of(serving.snapshot) is fields  # reused while the snapshot serves
    with Retriever.load(build_dir(root, staged), RetrieverConfig(),
                        encoder=serving.encoder) as candidate:
        other = summaries.of(candidate.snapshot)
    assert other is not fields and other["department"]["of"] == STAGED_DOCS


def test_a_side_with_other_ranking_is_with_ranking_of_the_library(client, serving):
    answer = client.post("/v1/console/search", json={
        "query": QUERY, "filters": FILTERS, "k": 8, "explain": True,
        "side": {"ranking": {"fusion": "rrf", "vector_weight": 0.3}}})
    assert answer.status_code == 200, answer.text
    with serving.with_ranking(fusion="rrf", vector_weight=0.3) as variant:
        expected = variant.search(QUERY, FILTERS, 8, explain=True)
    hits = answer.json()["hits"]
    assert [(h["doc_id"], h["score"]) for h in hits] == [(h.doc_id, h.score)
                                                         for h in expected.hits]
    assert {h["explanation"]["fusion"] for h in hits} == {"rrf"}
    default = serving.search(QUERY, FILTERS, 8)
    assert [h.doc_id for h in default.hits] != [h["doc_id"] for h in hits]  # it did change


def test_comparing_two_builds_gives_the_gates_overlap(client, serving, two_builds):
    root, _, staged = two_builds
    answer = client.post("/v1/console/compare", json={
        "query": QUERY, "k": 10, "right": {"build": staged}})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    with Retriever.load(build_dir(root, staged), RetrieverConfig(),
                        encoder=serving.encoder) as candidate:
        right = candidate.search(QUERY, k=10)
    left = serving.search(QUERY, k=10)
    ids = [[h.doc_id for h in r.hits] for r in (left, right)]
    assert [h["doc_id"] for h in body["right"]["hits"]] == ids[1]
    assert body["comparison"]["overlap"] == overlap_at_k(ids[0], ids[1], 10)
    assert body["comparison"] == compare_results(left, right, 10).model_dump()
    assert body["comparison"]["left_out"], "the staged build lacks documents 121-150"
    assert all(int(doc) > STAGED_DOCS for doc in body["comparison"]["left_out"])


@pytest.mark.parametrize(("filters", "hits"), [({"id": {"in": ["145", "21"]}}, 2),
                                              ({"id": "no-such-document"}, 0)])
def test_the_same_ranking_overlaps_fully_however_few_its_hits(client, filters, hits):
    """Two hits (k = 10) of the serving build against themselves overlapped 0.2, none 0.0."""
    answer = client.post("/v1/console/compare", json={
        "query": "heat transfer", "k": 10, "filters": filters, "right": {}})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert len(body["left"]["hits"]) == len(body["right"]["hits"]) == hits
    assert body["comparison"]["overlap"] == 1.0


def test_compare_results_names_moves_entries_and_exits(serving):
    left = serving.search(QUERY, k=5)
    right = serving.search("heat transfer", k=5)
    comparison = compare_results(left, right, 5)
    ranks = {m.key: (m.left, m.right) for m in comparison.moves}
    for i, hit in enumerate(left.hits, 1):
        assert ranks[hit.doc_id][0] == i
    assert set(comparison.entered) == {h.doc_id for h in right.hits} - {h.doc_id for h in
                                                                        left.hits}
    same = compare_results(left, left, 5)
    assert same.overlap == 1.0 and not same.entered and not same.left_out
    assert all(m.delta == 0 for m in same.moves)


def test_the_gate_over_a_query_file_is_the_publish_gates_report(client, serving, two_builds):
    root, live, staged = two_builds
    queries = [{"query": QUERY, "expected": ["1"]}, {"query": "buckling of shells",
                                                     "relevant": {"10": 1}}]
    answer = client.post("/v1/console/gate", json={"right": staged, "queries": queries,
                                                    "thresholds": {"k": 5}})
    assert answer.status_code == 200, answer.text
    report = answer.json()
    expected = compare_builds(
        build_dir(root, live), build_dir(root, staged), GateConfig(k=5), encoder=serving.encoder,
        config=serving.config,
        inputs=SearchInputs([Canary(query=q["query"], expected=q.get("expected", []))
                             for q in queries], []))
    checks = {c["name"]: c for c in report["checks"]}
    for check in expected.checks:
        assert checks[check.name]["outcome"] == check.outcome
        assert checks[check.name]["summary"] == check.summary
    assert checks["document count"]["outcome"] == "refused"  # 150 -> 120 is a 20% drop
    assert checks["labeled log nDCG"]["figures"]["queries"] == 1


@pytest.mark.parametrize(("path", "body", "status", "error", "says"), [
    ("/v1/console/compare", {"query": "x", "right": {"build": "no-such-build"}}, 404,
     "UnknownBuildError", "builds there:"),
    ("/v1/console/search", {"query": "x", "side": {"ranking": {"bm25_k1": 2}}}, 422,
     "RequestFieldError", "unknown field 'side.ranking.bm25_k1'"),
    ("/v1/console/search", {"query": "x", "side": {"ranking": {"vector_weight": 2}}}, 422,
     "RequestFieldError", "side.ranking.vector_weight"),
    ("/v1/console/gate", {"right": "x", "queries": []}, 422, "RequestFieldError", "queries"),
    ("/v1/console/gate", {"right": "x", "queries": [{"query": "q"}],
                          "thresholds": {"canaries": "/etc/passwd"}}, 422,
     "RequestFieldError", "cannot name canaries"),
    ("/v1/console/gate", {"right": "x", "queries": [{"query": "q"}],
                          "thresholds": {"min_canary_overlap": 3}}, 422,
     "RequestFieldError", "invalid gate thresholds: thresholds.min_canary_overlap: Input "
     "should be less than or equal to 1 (got 3)"),
    ("/v1/console/gate", {"right": "x", "queries": [{"query": "q"}],
                          "thresholds": {"min_canary_overlp": 0.5, "k": 0}}, 422,
     "RequestFieldError", "thresholds.k: Input should be greater than or equal to 1 (got 0); "
     "unknown threshold 'thresholds.min_canary_overlp' (did you mean 'min_canary_overlap'?)"),
    # "" was taken for the serving build
    ("/v1/console/search", {"query": "x", "side": {"build": ""}}, 422, "RequestFieldError",
     "side.build"),
    ("/v1/console/compare", {"query": "x", "right": {"build": ""}}, 422, "RequestFieldError",
     "right.build"),
])
def test_bad_console_requests_get_typed_errors_and_it_keeps_serving(client, path, body, status,
                                                                   error, says):
    answer = client.post(path, json=body)
    assert answer.status_code == status, answer.text
    message = answer.json()["error"]["message"]
    assert answer.json()["error"]["type"] == error and says in message
    assert "/tmp" not in message and "pytest" not in message  # no server paths
    assert "\n" not in message and "pydantic.dev" not in message  # one line, no links
    assert client.post("/v1/search", json={"query": QUERY, "k": 2}).status_code == 200


def test_a_side_keeps_only_hits_above_min_score_as_search_does(client, serving):
    """min_score was accepted and ignored (every hit came back), and not checked."""
    threshold = sorted(h.relevance for h in serving.search(QUERY, k=10).hits)[5]
    want = [h.doc_id for h in serving.search(QUERY, k=10, min_score=threshold).hits]
    answer = client.post("/v1/console/search", json={"query": QUERY, "k": 10,
                                                     "min_score": threshold})
    assert answer.status_code == 200, answer.text
    assert [h["doc_id"] for h in answer.json()["hits"]] == want and len(want) < 10
    bad = client.post("/v1/console/search", json={"query": QUERY, "min_score": 5})
    assert bad.status_code == 400 and "min_score" in bad.json()["error"]["message"]


@pytest.mark.parametrize("outside", ["{other}", "../../../{other_name}/index/builds/{other_id}",
                                     "..", ".tmp-x", "/etc"])
def test_a_side_or_gate_names_builds_of_this_index_only(client, other_build, outside):
    """A build id that is a path opened another index's build (any directory holding a
    manifest) and searched it."""
    path, other_id = other_build
    name = outside.format(other=path, other_name=path.parents[2].name, other_id=other_id)
    for route, body in (("/v1/console/search", {"query": QUERY, "side": {"build": name}}),
                        ("/v1/console/gate", {"right": name, "queries": [{"query": "q"}]})):
        answer = client.post(route, json=body)
        assert answer.status_code == 404, answer.text
        assert answer.json()["error"]["type"] == "UnknownBuildError"


@pytest.mark.parametrize("headers", [{"origin": "http://evil.example"},
                                     {"host": "evil.example"},
                                     {"host": "evil.example", "origin": "http://evil.example"}])
def test_a_keyless_consoles_api_answers_its_own_loopback_page_only(client, headers):
    """Another site's page (its Origin, even a no-cors POST) or a name it pointed at the
    loopback address (DNS rebinding: its Host) is refused; the page's own requests pass."""
    for answer in (client.get("/v1/console/schema", headers=headers),
                   client.post("/v1/console/search", json={"query": QUERY}, headers=headers)):
        assert answer.status_code == 403, answer.text
        assert "answers its own page on loopback" in answer.json()["error"]["message"]
    own = client.post("/v1/console/search", json={"query": QUERY},
                      headers={"origin": "http://127.0.0.1"})
    assert own.status_code == 200, own.text


def test_the_page_is_open_and_its_api_needs_an_admin_key(two_builds, serving):
    keys = ApiKeys([(READ_KEY, "read"), (ADMIN_KEY, "admin")])
    with app_client(two_builds[0], serving, keys) as client:
        wait_ready(client)
        page = client.get("/console")
        assert page.status_code == 200 and "default-src 'self'" in page.headers[
            "content-security-policy"]
        assert client.get("/console/console.js").status_code == 200
        missing = client.get("/console/secret.txt", headers={
            "authorization": f"Bearer {ADMIN_KEY}"})
        assert missing.status_code == 404  # only its own files, and an error as the API's
        assert missing.json()["error"]["type"] == "NotFoundError"
        assert "console.js" in missing.json()["error"]["message"]
        assert client.get("/v1/console/schema").status_code == 401
        read = client.get("/v1/console/schema", headers={"authorization": f"Bearer {READ_KEY}"})
        assert read.status_code == 403 and read.json()["error"]["type"] == "ForbiddenError"
        admin = client.get("/v1/console/schema",
                           headers={"authorization": f"Bearer {ADMIN_KEY}"})
        assert admin.status_code == 200


def test_the_console_is_off_when_asked_and_by_default_off_loopback(two_builds, serving):
    assert ServerSettings().console_enabled and ServerSettings(host="::1").console_enabled
    assert not ServerSettings(host="0.0.0.0").console_enabled
    assert ServerSettings(host="0.0.0.0", console="on", api_keys_env="KEYS").console_enabled
    with pytest.raises(ValueError, match="console=on with host=0.0.0.0"):
        ServerSettings(host="0.0.0.0", console="on")
    with app_client(two_builds[0], serving, console="off") as client:
        assert client.get("/console").status_code == 404
        assert client.get("/v1/console/schema").status_code == 404


def test_with_ranking_refuses_what_it_cannot_change(serving):
    with pytest.raises(ConfigError, match="cache cannot change per comparison"):
        serving.with_ranking(cache={"backend": "redis"})
    with pytest.raises(ConfigError):
        serving.with_ranking(vector_weight=7.0)


def test_a_passage_build_offers_grouping_and_compares_by_document(passage_roots, query_encoder):
    root = passage_roots("passages")
    with Retriever.load(root, RetrieverConfig(), encoder=query_encoder) as passages, \
            app_client(root, passages) as client:
        wait_ready(client)
        assert client.get("/v1/console/schema").json()["passages"] is True
        body = {"query": "cancer cells", "k": 5, "group_by": "document", "context": 1,
                "left": {}, "right": {"ranking": {"fusion": "rrf"}}}
        answer = client.post("/v1/console/compare", json=body)
        assert answer.status_code == 200, answer.text
        right = answer.json()["right"]["hits"]
        assert len({h["doc_id"] for h in right}) == len(right) == 5  # one hit per document
        assert all(h["context"] is not None for h in right)
        with passages.with_ranking(fusion="rrf") as variant:
            expected = variant.search("cancer cells", k=5, group_by="document", context=1)
        assert [h["doc_id"] for h in right] == [h.doc_id for h in expected.hits]
        keys = [m["key"] for m in answer.json()["comparison"]["moves"]]
        assert keys and all("#" not in key for key in keys)  # grouped: documents compared
        ungrouped = client.post("/v1/console/compare", json={**body, "group_by": None,
                                                             "context": None}).json()
        assert ungrouped["comparison"]["by"] == "passage"
        assert all("#" in m["key"] for m in ungrouped["comparison"]["moves"])
