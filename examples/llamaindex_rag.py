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
import sys
import tempfile
from pathlib import Path

from llama_index.core.llms import MockLLM
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.vector_stores import (
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
)

from indexes.build import build_index
from indexes.docstore import Document as Passage
from indexes.encoders import SentenceTransformerEncoder
from retrieval import Retriever
from retrieval.integrations.llamaindex import LlamaIndexRetriever

# A five-document corpus, so the example needs no prepared data.
DOCUMENTS = [
    Passage("d1", "Statin therapy lowers LDL cholesterol and the rate of major cardiovascular "
            "events in adults at elevated risk.", "Statins and heart disease",
            {"department": "cardiology", "year": 2012}),
    Passage("d2", "High-intensity statins reduce recurrent stroke after a first ischemic "
            "stroke, with a small increase in haemorrhagic stroke.", "Statins after stroke",
            {"department": "neurology", "year": 2006}),
    Passage("d3", "Regular aerobic exercise lowers resting blood pressure and improves "
            "cardiac function in older adults.", "Exercise and the heart",
            {"department": "cardiology", "year": 2018}),
    Passage("d4", "Mutations in BRCA1 raise the lifetime risk of breast and ovarian cancer.",
            "BRCA1", {"department": "oncology", "year": 2009}),
    Passage("d5", "Sleep deprivation impairs the consolidation of new memories.",
            "Sleep and memory", {"department": "neurology", "year": 2015}),
]


def index_path() -> Path:
    """The index named on the command line, or a tiny one built now in a temporary folder."""
    if len(sys.argv) > 1:
        return Path(sys.argv[1])
    root = Path(tempfile.mkdtemp(prefix="retrieval-example-")) / "index"
    build_index(DOCUMENTS, root, encoder=SentenceTransformerEncoder(), progress=False)
    return root


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
