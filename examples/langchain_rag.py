"""RAG with LangChain: our retriever → prompt → a chat model (langchain-core's fake one, so
this runs offline; put any LangChain chat model in its place).

    pip install 'retrieval[langchain]'
    HF_HUB_OFFLINE=1 python examples/langchain_rag.py [INDEX_DIR]

Without INDEX_DIR a five-document index is built in a temporary folder first.
"""

from __future__ import annotations

import asyncio

from example_index import index_path
from langchain_core.documents import Document
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough

from retrieval import Retriever
from retrieval.integrations.langchain import LangChainRetriever

PROMPT = ChatPromptTemplate.from_template(
    "Answer from the context only.\n\nContext:\n{context}\n\nQuestion: {question}")


def format_docs(docs: list[Document]) -> str:
    return "\n\n".join(f"[{d.id}] {d.page_content}" for d in docs)


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
