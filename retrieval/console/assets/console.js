// The retrieval console: a view over the service's own answers. Every number shown is one the
// server computed (/v1/search with explain, /v1/console/*); nothing is re-ranked here.

const $ = (id) => document.getElementById(id);
const KEY_STORAGE = "retrieval-console-key";
const state = { schema: null, key: sessionStorage.getItem(KEY_STORAGE) || "", view: "search" };

class ApiError extends Error {
  constructor(status, type, message) {
    super(message);
    this.status = status;
    this.type = type;
  }
}

// -- talking to the service ---------------------------------------------------------------

async function api(path, body) {
  const headers = { "content-type": "application/json" };
  if (state.key) headers.authorization = `Bearer ${state.key}`;
  const init = body === undefined ? { headers } : { method: "POST", headers, body: JSON.stringify(body) };
  const response = await fetch(path, init);
  const data = await response.json().catch(() => ({}));
  if (!response.ok) {
    if (response.status === 401 || response.status === 403) $("key-bar").hidden = false;
    const error = data.error || {};
    throw new ApiError(response.status, error.type || "HTTPError", error.message || response.statusText);
  }
  return data;
}

function showError(error) {
  const box = $("error");
  box.hidden = !error;
  box.textContent = error ? `${error.type || "Error"} (${error.status || "?"}): ${error.message}` : "";
}

async function guarded(action) {
  showError(null);
  try {
    await action();
  } catch (error) {
    showError(error);
  }
}

// -- small DOM helpers --------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "text") node.textContent = value;
    else if (name === "class") node.className = value;
    else if (name === "style") Object.assign(node.style, value); // CSSOM: allowed by the CSP
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) node.append(child);
  }
  return node;
}

const fmt = (x, digits = 4) => (typeof x === "number" ? x.toFixed(digits) : String(x));
const num = (id) => ($(id).value === "" ? null : Number($(id).value));

// -- schema: the filter and side controls ---------------------------------------------------

function keywordFilter(name, info) {
  const select = el("select", { id: `fk-${name}`, multiple: true, size: Math.min(4, info.common.length || 1),
                                "aria-label": `${name} values`, "data-field": name });
  for (const [value, count] of info.common) select.append(el("option", { value, text: `${value} (${count})` }));
  const mode = info.multi_valued
    ? el("select", { id: `fm-${name}`, "aria-label": `${name} match` },
         el("option", { value: "any", text: "any of" }), el("option", { value: "all", text: "all of" }))
    : null;
  const hint = `${info.distinct} values${info.multi_valued ? ", lists" : ""}`;
  return el("div", { class: "filter" }, el("label", { for: `fk-${name}`, text: `${name} (${hint})` }), mode, select);
}

function rangeFilter(name, info) {
  const type = info.kind === "date" ? "date" : "number";
  const bound = (which, value) => el("input", {
    id: `fr-${name}-${which}`, type, step: type === "number" ? "any" : null, "aria-label": `${name} ${which}`,
    placeholder: value === null ? "" : String(value).slice(0, 10),
  });
  return el("div", { class: "filter" }, el("span", { class: "filter-name", text: `${name} (${info.kind})` }),
            bound("from", info.min), el("span", { text: "–" }), bound("to", info.max));
}

function renderFilters(fields) {
  const box = $("filters");
  box.replaceChildren(el("legend", { text: "Filters" }));
  const names = Object.keys(fields);
  if (!names.length) box.append(el("p", { class: "muted", text: "this index has no metadata fields" }));
  for (const name of names) {
    const info = fields[name];
    box.append(info.kind === "keyword" ? keywordFilter(name, info) : rangeFilter(name, info));
  }
}

function readFilters() {
  const filters = {};
  for (const [name, info] of Object.entries(state.schema.fields)) {
    if (info.kind === "keyword") {
      const chosen = [...$(`fk-${name}`).selectedOptions].map((o) => o.value);
      if (!chosen.length) continue;
      if (info.multi_valued) filters[name] = { [$(`fm-${name}`).value]: chosen };
      else filters[name] = chosen.length === 1 ? chosen[0] : { in: chosen };
      continue;
    }
    const range = {};
    const from = $(`fr-${name}-from`).value;
    const to = $(`fr-${name}-to`).value;
    if (from !== "") range.gte = info.kind === "date" ? from : Number(from);
    if (to !== "") range.lte = info.kind === "date" ? `${to}T23:59:59Z` : Number(to);
    if (Object.keys(range).length) filters[name] = range;
  }
  return Object.keys(filters).length ? filters : null;
}

function sideControls(prefix) {
  const { ranking, builds } = state.schema;
  const build = el("select", { id: `${prefix}-build`, "aria-label": `${prefix} build` });
  for (const b of builds) {
    const label = `${b.build_id} (${b.serving ? "serving" : b.status}, ${b.documents} docs)`;
    build.append(el("option", { value: b.serving ? "" : b.build_id, text: label, selected: b.serving }));
  }
  const fusion = el("select", { id: `${prefix}-fusion`, "aria-label": `${prefix} fusion` },
                    el("option", { value: "", text: `fusion: server's (${ranking.fusion})` }),
                    ...["zscore", "minmax", "rrf"].map((f) => el("option", { value: f, text: f })));
  const weight = el("input", { id: `${prefix}-weight`, type: "number", min: 0, max: 1, step: 0.05,
                               placeholder: String(ranking.vector_weight), "aria-label": `${prefix} vector weight` });
  return [el("label", {}, "build ", build), fusion, el("label", {}, "vector weight ", weight)];
}

function readSide(prefix) {
  const side = { ranking: {} };
  if ($(`${prefix}-build`).value) side.build = $(`${prefix}-build`).value;
  if ($(`${prefix}-fusion`).value) side.ranking.fusion = $(`${prefix}-fusion`).value;
  const weight = num(`${prefix}-weight`);
  if (weight !== null) side.ranking.vector_weight = weight;
  return side;
}

const isDefault = (side) => !side.build && !Object.keys(side.ranking).length;

function renderSchema(schema) {
  state.schema = schema;
  $("build-info").textContent = `build ${schema.build_id} · ${schema.rows} ${schema.passages ? "passages" : "documents"}`;
  $("k").placeholder = String(schema.ranking.default_k);
  $("candidates").placeholder = String(schema.ranking.candidates);
  for (const node of document.querySelectorAll(".passages-only")) node.hidden = !schema.passages;
  renderFilters(schema.fields);
  $("side-search").replaceChildren(el("legend", { text: "Build and ranking" }), ...sideControls("search"));
  $("side-left").replaceChildren(el("legend", { text: "Left" }), ...sideControls("left"));
  $("side-right").replaceChildren(el("legend", { text: "Right" }), ...sideControls("right"));
  for (const id of ["gate-left", "gate-right"]) {
    const select = $(id);
    select.replaceChildren();
    for (const b of schema.builds) {
      const live = b.status === "live";
      select.append(el("option", { value: b.build_id, text: `${b.build_id} (${b.status})`,
                                   selected: id === "gate-left" ? live : !live }));
    }
  }
}

// -- search ---------------------------------------------------------------------------------

function searchBody() {
  const body = { query: $("q").value, explain: true };
  const filters = readFilters();
  if (filters) body.filters = filters;
  if (num("k") !== null) body.k = num("k");
  if (num("candidates") !== null) body.candidates = num("candidates");
  if (state.schema.passages) {
    if ($("group-by").checked) body.group_by = "document";
    if (num("context")) body.context = num("context");
  }
  return body;
}

async function runSearch() {
  performance.mark("search-start"); // User Timing: devtools and benchmarks.console read these
  const body = searchBody();
  const side = readSide("search");
  const result = isDefault(side)
    ? await api("/v1/search", body)
    : await api("/v1/console/search", { ...body, side });
  renderSummary($("search-summary"), result);
  renderTimings($("timings"), result.timings);
  $("hits").replaceChildren(...result.hits.map((hit, i) => hitItem(hit, i + 1)));
  performance.measure("search", "search-start");
}

function renderSummary(box, result) {
  const cache = `cache: result ${result.cache.result}, embedding ${result.cache.embedding}`;
  box.replaceChildren(
    el("span", { id: box.id === "search-summary" ? "hit-count" : null, text: `${result.hits.length} hits` }),
    ` · ${result.allowed} allowed by the filters · ${result.candidates} candidates re-ranked · build ${result.build_id} · `,
    el("span", { class: "cache", text: cache }),
    ...result.warnings.map((w) => el("div", { class: "warning", text: w })),
    ...(result.degraded.length ? [el("div", { class: "warning", text: `degraded: ${result.degraded.join(", ")}` })] : []),
  );
}

function renderTimings(box, timings) {
  const total = timings.total || Object.values(timings).reduce((a, b) => a + b, 0) || 1;
  const stages = Object.entries(timings).filter(([name]) => name !== "total");
  const bar = el("div", { class: "bar", role: "img", "aria-label": "stage timings" },
    ...stages.map(([name, ms], i) => el("span", {
      class: `stage s${i % 6}`, title: `${name}: ${fmt(ms, 3)} ms`,
      style: { flexBasis: `${Math.max(0.5, (100 * ms) / total)}%` },
    })));
  const legend = el("ul", { class: "legend" },
    ...stages.map(([name, ms], i) => el("li", { class: `s${i % 6}`, "data-stage": name, text: `${name} ${fmt(ms, 3)} ms` })),
    el("li", { "data-stage": "total", text: `total ${fmt(total, 3)} ms` }));
  box.replaceChildren(bar, legend);
}

function hitItem(hit, rank) {
  const meta = Object.entries(hit.metadata).map(([k, v]) =>
    el("span", { class: "chip", text: `${k}: ${Array.isArray(v) ? v.join(", ") : v}` }));
  const head = el("div", { class: "hit-head" },
    el("span", { class: "rank", text: `#${rank}` }),
    el("span", { class: "doc-id", text: hit.passage === null || hit.passage === undefined ? hit.doc_id : `${hit.doc_id} · passage ${hit.passage}` }),
    el("span", { class: "score", "data-score": hit.score, text: fmt(hit.score) }),
    hit.relevance === null || hit.relevance === undefined ? null :
      el("span", { class: "relevance", "data-relevance": hit.relevance, title: "estimated probability that the hit is relevant (comparable across queries)", text: `P ${fmt(hit.relevance, 2)}` }),
    el("span", { class: "title", text: hit.title }));
  const text = hit.context ? hit.context.text : hit.text;
  return el("li", { class: "hit", "data-doc-id": hit.doc_id },
    head, el("p", { class: "text", text: text.length > 400 ? `${text.slice(0, 400)}…` : text }),
    el("div", { class: "meta" }, meta),
    hit.explanation ? explanationDetails(hit, rank) : null);
}

function explanationDetails(hit, rank) {
  // The tables are built when first opened: a result renders its hits only.
  const details = el("details", { class: "why" }, el("summary", { text: `why #${rank}` }));
  details.addEventListener("toggle", () => {
    if (details.open && details.childElementCount === 1) details.append(...explanationTables(hit));
  });
  return details;
}

function explanationTables(hit) {
  const why = hit.explanation;
  const row = (label, field, value, note = "") =>
    el("tr", {}, el("th", { scope: "row", text: label }),
       el("td", { "data-field": field, "data-value": value, text: fmt(value) }), el("td", { class: "muted", text: note }));
  const terms = Object.entries(why.bm25_terms).sort((a, b) => b[1] - a[1]);
  const termRows = terms.map(([term, part]) =>
    el("tr", {}, el("th", { scope: "row", text: term }), el("td", { "data-term": term, "data-value": part, text: fmt(part) })));
  const bounds = Object.entries(why.normalization).map(([name, value]) =>
    el("tr", {}, el("th", { scope: "row", text: name }), el("td", { "data-bound": name, "data-value": value, text: fmt(value) })));
  return [
    el("table", { class: "explain" },
      el("tbody", {},
        row("final score", "score", hit.score, `fused + features (${fmt(why.features)})`),
        row("fused", "fused", why.fused, `${why.fusion}, vector weight ${why.vector_weight}, over ${why.candidates} candidates`),
        row("BM25", "bm25", why.bm25, `rank ${why.bm25_rank} of ${why.candidates} by keywords`),
        row("cosine", "vector", why.vector, `rank ${why.vector_rank} of ${why.candidates} by vectors`),
        row("features", "features", why.features),
        row("keyword coverage", "coverage", why.coverage, "BM25 over the most these terms can score"),
        hit.relevance === null || hit.relevance === undefined ? null :
          row("relevance", "relevance", hit.relevance, "P(relevant): cosine, coverage and rank, calibrated on judged queries"))),
    el("div", { class: "explain-parts" },
      el("table", { class: "terms" }, el("caption", { text: "BM25 by query term" }), el("tbody", {}, termRows)),
      el("table", { class: "bounds" }, el("caption", { text: `${why.fusion} normalization` }), el("tbody", {}, bounds)))];
}

// -- compare ----------------------------------------------------------------------------------

async function runCompare() {
  const body = { ...searchBody(), left: readSide("left"), right: readSide("right") };
  const answer = await api("/v1/console/compare", body);
  const c = answer.comparison;
  $("compare-summary").replaceChildren(
    el("div", {}, `overlap@${c.k}: `, el("strong", { id: "overlap", "data-value": c.overlap, text: fmt(c.overlap, 2) }),
       ` · ${c.entered.length} entered · ${c.left_out.length} left`),
    c.entered.length ? el("div", { text: `entered: ${c.entered.join(", ")}` }) : null,
    c.left_out.length ? el("div", { text: `left out: ${c.left_out.join(", ")}` }) : null);
  const moves = new Map(c.moves.map((m) => [m.key, m]));
  const keyOf = (hit) => (c.by === "document" || hit.passage === null || hit.passage === undefined
    ? hit.doc_id : `${hit.doc_id}#${hit.passage}`);
  const mark = (rank, other, side) => {
    if (!other) return side === "right" ? "new" : "out";
    if (other === rank) return "=";
    if (side === "left") return `→ #${other}`;
    return other > rank ? `↑${other - rank}` : `↓${rank - other}`;
  };
  const item = (hit, i, side) => {
    const move = moves.get(keyOf(hit));
    const other = side === "left" ? move?.right : move?.left;
    return el("li", { class: other ? "hit" : "hit changed", "data-doc-id": hit.doc_id },
      el("span", { class: "rank", text: `#${i + 1}` }), el("span", { class: "doc-id", text: keyOf(hit) }),
      el("span", { class: "move", text: mark(i + 1, other, side) }), el("span", { class: "title", text: hit.title }));
  };
  const title = (side, result) => `${side}: ${result.build_id} · ${fmt(result.timings.total, 2)} ms`;
  $("left-title").textContent = title("left", answer.left);
  $("right-title").textContent = title("right", answer.right);
  $("left-hits").replaceChildren(...answer.left.hits.map((h, i) => item(h, i, "left")));
  $("right-hits").replaceChildren(...answer.right.hits.map((h, i) => item(h, i, "right")));
}

// -- the gate ---------------------------------------------------------------------------------

function gateQueries() {
  const lines = $("gate-queries").value.split("\n").map((l) => l.trim()).filter(Boolean);
  return lines.map((line, i) => {
    try {
      return JSON.parse(line);
    } catch {
      throw new ApiError(0, "QueryFileError", `line ${i + 1} of the query file is not JSON: ${line.slice(0, 80)}`);
    }
  });
}

async function runGate() {
  const body = { left: $("gate-left").value || null, right: $("gate-right").value, queries: gateQueries(),
                 thresholds: { k: num("gate-k") || 10 } };
  $("gate-summary").textContent = "running…";
  const report = await api("/v1/console/gate", body);
  const refused = report.checks.filter((c) => c.outcome === "refused");
  $("gate-summary").replaceChildren(
    el("strong", { id: "gate-verdict", text: refused.length ? `refused by: ${refused.map((c) => c.name).join(", ")}` : "passed" }),
    ` · ${report.candidate_build} against ${report.live_build} · ${fmt(report.seconds, 2)} s`);
  const rows = report.checks.map((c) => el("tr", { class: c.outcome, "data-check": c.name },
    el("td", { text: c.name }), el("td", { text: c.outcome }), el("td", { text: c.summary }), el("td", { text: c.threshold })));
  $("gate-report").querySelector("tbody").replaceChildren(...rows);
  $("gate-report").hidden = false;
}

// -- navigation and keys ------------------------------------------------------------------------

function showView(view) {
  state.view = view;
  for (const name of ["search", "compare", "gate"]) {
    $(`view-${name}`).hidden = name !== view;
    $(`tab-${name}`).setAttribute("aria-selected", String(name === view));
    $(`tab-${name}`).tabIndex = name === view ? 0 : -1;
  }
  $("query-form").hidden = view === "gate";
  $("run").textContent = view === "compare" ? "Compare" : "Search";
}

function wire() {
  const tabs = ["search", "compare", "gate"];
  tabs.forEach((name, i) => {
    const tab = $(`tab-${name}`);
    tab.addEventListener("click", () => showView(name));
    tab.addEventListener("keydown", (event) => {
      const step = { ArrowRight: 1, ArrowLeft: -1 }[event.key];
      if (!step) return;
      const next = tabs[(i + step + tabs.length) % tabs.length];
      showView(next);
      $(`tab-${next}`).focus();
    });
  });
  $("query-form").addEventListener("submit", (event) => {
    event.preventDefault();
    guarded(state.view === "compare" ? runCompare : runSearch);
  });
  $("gate-form").addEventListener("submit", (event) => {
    event.preventDefault();
    guarded(runGate);
  });
  $("gate-file").addEventListener("change", async () => {
    const file = $("gate-file").files[0];
    if (file) $("gate-queries").value = await file.text();
  });
  $("key-bar").addEventListener("submit", (event) => {
    event.preventDefault();
    state.key = $("api-key").value.trim();
    sessionStorage.setItem(KEY_STORAGE, state.key);
    $("key-bar").hidden = true;
    guarded(load);
  });
  document.addEventListener("keydown", (event) => {
    const typing = ["INPUT", "TEXTAREA", "SELECT"].includes(document.activeElement?.tagName);
    if (event.key === "/" && !typing) {
      event.preventDefault();
      $("q").focus();
    }
  });
}

async function load() {
  renderSchema(await api("/v1/console/schema"));
  performance.mark("console-ready"); // since navigation start
  document.body.dataset.ready = "true";
}

wire();
showView("search");
guarded(load);
