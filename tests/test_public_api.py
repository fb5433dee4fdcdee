"""The public API is complete: what the README and examples import, every configuration section
a user writes and every error family are exported by ``retrieval``; both packages are typed."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import pkgutil
import re
from pathlib import Path

from pydantic import BaseModel

import indexes
import retrieval
from retrieval import RetrievalError, RetrieverConfig

ROOT = Path(__file__).resolve().parents[1]


def _python_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, flags=re.S)


def _names_imported_from_retrieval(source: str) -> set[str]:
    tree = ast.parse(source)
    return {alias.name for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module == "retrieval"
            for alias in node.names}


def _documented_sources() -> dict[str, str]:
    sources = {}
    for doc in (ROOT / "README.md", ROOT / "benchmarks" / "README.md"):
        for i, block in enumerate(_python_blocks(doc.read_text(encoding="utf-8"))):
            # Blocks are excerpts: keep their import lines, which must parse on their own.
            imports = "\n".join(line for line in block.splitlines()
                                if line.startswith(("from ", "import ")))
            sources[f"{doc.name} block {i}"] = imports
    for path in sorted((ROOT / "examples").rglob("*.py")):
        sources[str(path.relative_to(ROOT))] = path.read_text(encoding="utf-8")
    return sources


def test_everything_the_docs_and_examples_import_is_exported():
    sources = _documented_sources()
    assert any("examples/" in name for name in sources), "examples/*.py not found"
    used = set()
    for name, source in sources.items():
        names = _names_imported_from_retrieval(source)
        missing = names - set(retrieval.__all__)
        assert not missing, f"{name} imports {missing} from retrieval, not in __all__"
        used |= names
    assert {"Retriever", "RetrieverConfig"} <= used


def test_every_configuration_section_a_user_writes_is_exported():
    sections = set()
    for field in RetrieverConfig.model_fields.values():
        for candidate in (field.annotation, *getattr(field.annotation, "__args__", ())):
            for kind in (candidate, *getattr(candidate, "__args__", ())):
                if inspect.isclass(kind) and issubclass(kind, BaseModel):
                    sections.add(kind.__name__)
    assert sections >= {"CacheConfig", "FeatureStoreConfig", "FeatureWeights", "RecencyWeight",
                        "BatchingConfig", "TracingConfig", "Limits"}
    assert sections <= set(retrieval.__all__), sections - set(retrieval.__all__)


def _all_modules(package) -> None:
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)


def _subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub, *_subclasses(sub)}
    return found


def test_every_error_class_is_exported_and_drawn_in_the_tree():
    _all_modules(indexes)
    _all_modules(retrieval)
    ours = {cls for cls in _subclasses(RetrievalError)
            if cls.__module__.split(".")[0] in ("indexes", "retrieval")}
    names = {cls.__name__ for cls in ours | {RetrievalError}}
    assert len(names) >= 20
    assert names <= set(retrieval.__all__), names - set(retrieval.__all__)
    tree = importlib.import_module("indexes.errors").__doc__
    undrawn = {name for name in names if not re.search(rf"[─ ]{name}\b", tree)}
    assert not undrawn, f"the error tree in indexes/errors.py misses {undrawn}"


def test_both_packages_ship_py_typed_and_the_console_its_assets():
    for package in (retrieval, indexes):
        assert (Path(package.__file__).parent / "py.typed").is_file()
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'retrieval = \["py.typed", "console/assets/\*"\]', pyproject)
    assets = {p.name for p in (Path(retrieval.__file__).parent / "console" / "assets").iterdir()}
    assert assets == {"index.html", "console.js", "console.css"}
    assert re.search(r'indexes = \["py.typed", "distilled/\*/\*"\]', pyproject)


def test_example_configuration_is_valid():
    spec = importlib.util.spec_from_file_location("quickstart", ROOT / "examples" / "quickstart.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # main() is not run: it builds an index
    config = module.make_config()
    assert isinstance(config, RetrieverConfig)
    assert config.recency.field == "published" and config.limits.max_k == 100
