"""RAG with LangChain: our retriever → prompt → a chat model (langchain-core's fake one, so
this runs offline; put any LangChain chat model in its place).

    pip install 'retrieval[langchain]'
    HF_HUB_OFFLINE=1 python examples/langchain_rag.py [INDEX_DIR]

Without INDEX_DIR a five-document index is built in a temporary folder first.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from langchain_core.documents import Document
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough

from indexes.build import build_index
from indexes.docstore import Document as Passage
from indexes.encoders import SentenceTransformerEncoder
from retrieval import Retriever
from retrieval.integrations.langchain import LangChainRetriever

PROMPT = ChatPromptTemplate.from_template(
    "Answer from the context only.\n\nContext:\n{context}\n\nQuestion: {question}")


def format_docs(docs: list[Document]) -> str:
    return "\n\n".join(f"[{d.id}] {d.page_content}" for d in docs)


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
    retriever = LangChainRetriever(engine, k=2, filters={"department": "cardiology"})
    model = FakeListChatModel(responses=["Statins lower cardiovascular events [d1]."])
    chain = ({"context": retriever | format_docs, "question": RunnablePassthrough()}
             | PROMPT | model | StrOutputParser())

    question = "Do statins reduce heart attacks?"
    for doc in retriever.invoke(question):
        print(f"{doc.id}  score={doc.metadata['score']:.3f}  {doc.metadata['department']}")
    print("answer:", chain.invoke(question))

    # Per-call overrides, async, and one encoder call for a batch of questions.
    print("k=1, any department:", [d.id for d in retriever.invoke(question, k=1, filters=None)])
    print("async:", [d.id for d in asyncio.run(retriever.ainvoke("exercise and blood pressure"))])
    print("batch:", [[d.id for d in docs] for docs in retriever.batch(
        ["blood pressure", "cholesterol"], filters='year >= 2010')])
    engine.close()


if __name__ == "__main__":
    main()
