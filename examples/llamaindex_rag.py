"""RAG with LlamaIndex: our retriever inside a RetrieverQueryEngine with LlamaIndex's MockLLM
(so this runs offline; pass any LlamaIndex LLM instead).

    pip install 'retrieval[llamaindex]'
    HF_HUB_OFFLINE=1 python examples/llamaindex_rag.py [INDEX_DIR]

Without INDEX_DIR a five-document index is built in a temporary folder first. LlamaIndex
reads its tokenizer and NLTK data from files bundled with llama-index-core: nothing is
downloaded.
"""

from __future__ import annotations

import asyncio

from example_index import index_path
from llama_index.core.llms import MockLLM
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.vector_stores import (
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
)

from retrieval import Retriever
from retrieval.integrations.llamaindex import LlamaIndexRetriever


def main() -> None:
    engine = Retriever.load(index_path())
    # department = cardiology OR year < 2010, in LlamaIndex's own filter objects.
    filters = MetadataFilters(condition=FilterCondition.OR, filters=[
        MetadataFilter(key="department", value="cardiology"),
        MetadataFilter(key="year", value=2010, operator=FilterOperator.LT),
    ])
    retriever = LlamaIndexRetriever(engine, k=3, filters=filters)
    query_engine = RetrieverQueryEngine.from_args(retriever, llm=MockLLM())

    response = query_engine.query("Do statins prevent strokes?")
    for node in response.source_nodes:
        print(f"{node.node.node_id}  score={node.score:.3f}  {node.node.metadata['department']}")
    # MockLLM answers with the prompt it was given: the retrieved passages are in it.
    print("answer:", str(response)[:300].replace("\n", " "), "...")

    nodes = asyncio.run(retriever.aretrieve("blood pressure"))
    print("async:", [n.node.node_id for n in nodes])
    engine.close()


if __name__ == "__main__":
    main()
