"""A LangChain retriever over the engine: ``LangChainRetriever(Retriever.load(path), k=5)``.

``k``, ``filters`` (dict or DSL), ``candidates``, ``min_seq`` (read-your-writes) and
``deadline_ms`` are set at construction and can be overridden per call:
``retriever.invoke("q", k=3, min_seq=ack.seq)``. ``ainvoke`` awaits the engine's async search
(the loop is never blocked); ``batch`` and ``abatch`` search all inputs in one
``search_batch`` call (one encoder call for the batch; a deadline is one budget for it all).
Over a backend whose methods lack an option that is set (an older protocol), the adapter
raises ``NotASearchBackendError``: at construction for a configured option, else on the call.
"""

from __future__ import annotations

from typing import Any, cast

from pydantic import ConfigDict

from retrieval.errors import InvalidQueryError
from retrieval.integrations.backend import (
    FilterSpec,
    SearchBackend,
    check_backend,
    check_count,
    check_filters,
    check_options,
    grouping_options,
    hit_id,
    hit_metadata,
    passage,
    read_options,
    result_notes,
)
from retrieval.integrations.errors import MissingExtraError
from retrieval.integrations.trusted import TrustedModel
from retrieval.models import SearchResult
from retrieval.relevance import check_min_score
from retrieval.request_path.grouping import check_grouping

try:
    # The first callback set-up in a process imports these (~70 ms); importing them here keeps
    # that out of the first ``ainvoke``, where it would stall a running event loop.
    import langchain_core.tracers.context  # noqa: F401
    import langchain_core.tracers.stdout  # noqa: F401
    from langchain_core.callbacks import (
        AsyncCallbackManager,
        AsyncCallbackManagerForRetrieverRun,
        CallbackManager,
        CallbackManagerForRetrieverRun,
    )
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
    from langchain_core.runnables import RunnableConfig
    from langchain_core.runnables.config import get_config_list, get_executor_for_config
    from langchain_core.runnables.utils import gather_with_concurrency
except ImportError as exc:
    raise MissingExtraError("langchain", "langchain-core") from exc

__all__ = ["LangChainRetriever", "to_documents"]

# The backend's methods this adapter calls.
_BACKEND_METHODS = ("search", "search_batch", "asearch", "asearch_batch")
# Options ``invoke`` forwards that are the framework's own, not search options.
_FRAMEWORK_KWARGS = frozenset({"verbose"})
_SEARCH_OPTIONS = ("k", "filters", "candidates", "group_by", "context", "min_score",
                   "min_seq", "deadline_ms")
_ALLOWED_KWARGS = _FRAMEWORK_KWARGS | frozenset(_SEARCH_OPTIONS)
_DOCUMENT = TrustedModel(Document, id="", page_content="", metadata={})


def to_documents(result: SearchResult) -> list[Document]:
    """Hits as LangChain documents: id = doc id (``id#position`` for a passage),
    page_content = title + text (or the passage's context when asked for), metadata = the
    document's metadata plus ``score``, ``bm25_score``, ``vector_score``, ``build_id``, for
    passages ``parent_id``, ``passage``, ``start``, ``end``, and the result's ``degraded`` /
    ``warnings`` when it has them."""
    build, build_id, notes = _DOCUMENT.build, result.build_id, result_notes(result)
    return [build(id=hit_id(hit), page_content=passage(hit),
                  metadata=hit_metadata(hit, build_id, notes))
            for hit in result.hits]


class LangChainRetriever(BaseRetriever):
    """LangChain ``BaseRetriever`` wrapping a ``Retriever`` or any ``SearchBackend``."""

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    retriever: Any
    k: int | None = None
    filters: dict[str, Any] | str | None = None
    candidates: int | None = None
    group_by: str | None = None
    context: int = 0
    min_score: float | None = None  # hits below this relevance are left out
    min_seq: int | None = None  # see at least the write that returned this seq
    deadline_ms: float | None = None  # None: the retriever's configured deadline

    def __init__(self, retriever: SearchBackend, *, k: int | None = None,
                 filters: FilterSpec = None, candidates: int | None = None,
                 group_by: str | None = None, context: int = 0,
                 min_score: float | None = None, min_seq: int | None = None,
                 deadline_ms: float | None = None, **fields: Any) -> None:
        # Checked here so bad arguments raise the library's typed errors, not pydantic's.
        unknown = sorted(set(fields) - set(BaseRetriever.model_fields))
        if unknown:
            hint = (": MMR and score thresholds are a vector store's: use "
                    "RetrievalVectorStore(root).as_retriever(search_type=...) "
                    "(retrieval.integrations.langchain_store)" if "search_type" in unknown
                    else "")
            raise InvalidQueryError(f"LangChainRetriever takes no {', '.join(unknown)}; it "
                                    f"takes {', '.join(_SEARCH_OPTIONS)}{hint}")
        group_by, context = check_grouping(group_by, context)
        super().__init__(retriever=check_backend(retriever), k=check_count("k", k),
                         filters=check_filters(filters),
                         candidates=check_count("candidates", candidates), group_by=group_by,
                         context=context, min_score=check_min_score(min_score),
                         **read_options(min_seq, deadline_ms), **fields)
        self._options({}, *_BACKEND_METHODS)  # a configured option the backend cannot take

    # -- one query ----------------------------------------------------------------------------

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, **options: Any
    ) -> list[Document]:
        return self._search(query, options)

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun, **options: Any
    ) -> list[Document]:
        return await self._asearch(query, options)

    def _search(self, query: str, overrides: dict[str, Any]) -> list[Document]:
        filters, k, search = self._options(overrides, "search")
        return to_documents(self.retriever.search(query, filters, k, **search))

    async def _asearch(self, query: str, overrides: dict[str, Any]) -> list[Document]:
        filters, k, search = self._options(overrides, "asearch")
        return to_documents(await self.retriever.asearch(query, filters, k, **search))

    # -- many queries: one engine call ----------------------------------------------------------

    def batch(self, inputs: list[str], config: RunnableConfig | list[RunnableConfig] | None = None,
              *, return_exceptions: bool = False, **kwargs: Any) -> list[list[Document]]:
        """All inputs in one ``search_batch``; each input gets one callback run, started and
        then ended or errored once, as ``invoke`` reports it."""
        if not inputs:
            return []
        configs = get_config_list(config, len(inputs))
        runs = [self._sync_manager(config_).on_retriever_start(
                    None, query, name=self._run_name(config_), run_id=config_.pop("run_id", None))
                for query, config_ in zip(inputs, configs, strict=True)]
        try:
            filters, k, search = self._options(kwargs, "search_batch")
            results = self.retriever.search_batch(inputs, filters, k, **search)
        except Exception as exc:
            if not return_exceptions:
                for run in runs:
                    run.on_retriever_error(exc)
                raise
        else:
            documents = [to_documents(result) for result in results]
            for run, docs in zip(runs, documents, strict=True):
                run.on_retriever_end(docs)
            return documents

        # One bad input failed the whole batch: search each input for its own outcome.
        with get_executor_for_config(configs[0]) as executor:
            outcomes = list(executor.map(self._search_in_run, inputs, runs,
                                         [kwargs] * len(inputs)))
        return _outcomes(outcomes, return_exceptions)

    async def abatch(self, inputs: list[str],
                     config: RunnableConfig | list[RunnableConfig] | None = None,
                     *, return_exceptions: bool = False, **kwargs: Any) -> list[list[Document]]:
        """``batch`` over the engine's async batch search."""
        if not inputs:
            return []
        configs = get_config_list(config, len(inputs))
        runs = [await self._async_manager(config_).on_retriever_start(
                    None, query, name=self._run_name(config_), run_id=config_.pop("run_id", None))
                for query, config_ in zip(inputs, configs, strict=True)]
        try:
            filters, k, search = self._options(kwargs, "asearch_batch")
            results = await self.retriever.asearch_batch(inputs, filters, k, **search)
        except Exception as exc:
            if not return_exceptions:
                for run in runs:
                    await run.on_retriever_error(exc)
                raise
        else:
            documents = [to_documents(result) for result in results]
            for run, docs in zip(runs, documents, strict=True):
                await run.on_retriever_end(docs)
            return documents

        # One bad input failed the whole batch: search each input for its own outcome.
        outcomes = await gather_with_concurrency(
            configs[0].get("max_concurrency"),
            *(self._asearch_in_run(query, run, kwargs)
              for query, run in zip(inputs, runs, strict=True)))
        return _outcomes(outcomes, return_exceptions)

    def _search_in_run(self, query: str, run: CallbackManagerForRetrieverRun,
                       overrides: dict[str, Any]) -> list[Document] | Exception:
        """One input of a batch searched alone, its outcome reported to its own run (and
        returned, an exception included)."""
        try:
            docs = self._search(query, overrides)
        except Exception as exc:
            run.on_retriever_error(exc)
            return exc
        run.on_retriever_end(docs)
        return docs

    async def _asearch_in_run(self, query: str, run: AsyncCallbackManagerForRetrieverRun,
                              overrides: dict[str, Any]) -> list[Document] | Exception:
        try:
            docs = await self._asearch(query, overrides)
        except Exception as exc:
            await run.on_retriever_error(exc)
            return exc
        await run.on_retriever_end(docs)
        return docs

    # -- helpers --------------------------------------------------------------------------------

    def _options(self, overrides: dict[str, Any], *methods: str
                 ) -> tuple[FilterSpec, int | None, dict[str, Any]]:
        """(filters, k, the other search arguments) for a call of the backend's ``methods``:
        the per-call value where given, else the configured one (``check_options``)."""
        unknown = overrides.keys() - _ALLOWED_KWARGS
        if unknown:
            raise InvalidQueryError(f"unknown search option(s) {', '.join(sorted(unknown))}; "
                                    f"per call you can set {', '.join(_SEARCH_OPTIONS)}")
        k = overrides.get("k", self.k)
        filters = overrides.get("filters", self.filters)
        search = {"candidates": overrides.get("candidates", self.candidates),
                  **grouping_options(overrides.get("group_by", self.group_by),
                                     overrides.get("context", self.context),
                                     overrides.get("min_score", self.min_score)),
                  **read_options(overrides.get("min_seq", self.min_seq),
                                 overrides.get("deadline_ms", self.deadline_ms))}
        return filters, k, check_options(self.retriever, methods, search)

    def _run_name(self, config: RunnableConfig) -> str:
        return config.get("run_name") or self.get_name()

    def _callback_args(self, config: RunnableConfig) -> dict[str, Any]:
        return {"inheritable_tags": config.get("tags"), "local_tags": self.tags,
                "inheritable_metadata": {**(config.get("metadata") or {}),
                                         **self._get_ls_params()},
                "local_metadata": self.metadata}

    def _sync_manager(self, config: RunnableConfig) -> CallbackManager:
        return CallbackManager.configure(config.get("callbacks"), None,
                                         **self._callback_args(config))

    def _async_manager(self, config: RunnableConfig) -> AsyncCallbackManager:
        return AsyncCallbackManager.configure(config.get("callbacks"), None,
                                              **self._callback_args(config))


def _outcomes(outcomes: list[list[Document] | Exception], return_exceptions: bool
              ) -> list[list[Document]]:
    """Each input's documents, or its exception where ``return_exceptions``; otherwise the
    first input's exception is raised (every input has had its own run reported)."""
    if not return_exceptions:
        for outcome in outcomes:
            if isinstance(outcome, Exception):
                raise outcome
    # LangChain's contract: with return_exceptions an input's place holds its exception.
    return cast(list[list[Document]], outcomes)
