"""Package layout rules: import direction (also through import strings), no cycles, what
``import retrieval`` loads, sorted public names."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


# The feature store's offline half (the nightly job): the online half never imports it.
OFFLINE_FEATURES = "retrieval.features.offline"
OFFLINE_FEATURE_MODULES = {_name for _name in (
    ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    for p in (ROOT / "retrieval" / "features" / "offline").rglob("*.py"))}
# Modules that run the offline half on purpose: the command line and the demo.
OFFLINE_USERS = ("retrieval.cli", "retrieval.demo", "retrieval.demo_quality")


def _imports(path: Path) -> set[str]:
    return _imports_in(path.read_text(encoding="utf-8"))


def _imports_in(source: str) -> set[str]:
    """Modules a source imports at run time: import statements (not those under ``if
    TYPE_CHECKING:``), and import strings given as literals to ``importlib.import_module``,
    ``import_module`` or ``__import__``."""
    names: set[str] = set()
    for node in _runtime_nodes(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Call) and _is_import_call(node.func) and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                names.add(first.value)
    return names


def _runtime_nodes(tree: ast.AST):
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) \
                and node.test.id == "TYPE_CHECKING":
            yield from (n for child in node.orelse for n in [child, *_runtime_nodes(child)])
            continue
        yield node
        yield from _runtime_nodes(node)


def _is_import_call(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id in ("import_module", "__import__")
    return isinstance(func, ast.Attribute) and func.attr == "import_module"


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def test_import_strings_are_seen_as_imports():
    source = ("import importlib\nfrom importlib import import_module\n"
              "importlib.import_module('benchmarks.suite')\nimport_module('benchmarks.quality')\n"
              "__import__('benchmarks')\nimportlib.import_module(name)\n"
              "if TYPE_CHECKING:\n    import pyarrow\n")
    assert _imports_in(source) == {"importlib", "benchmarks.suite", "benchmarks.quality",
                                   "benchmarks"}


def test_indexes_never_imports_retrieval():
    for path in (ROOT / "indexes").rglob("*.py"):
        offending = {n for n in _imports(path) if n.split(".")[0] == "retrieval"}
        assert not offending, f"{path} imports {offending}: the offline layer must not"


def test_library_never_imports_benchmarks_or_generated_data():
    """Generated corpora and vectors (``benchmarks.synthetic*``) belong to benchmarks and tests:
    the shipped packages never import them."""
    for path in [*(ROOT / "retrieval").rglob("*.py"), *(ROOT / "indexes").rglob("*.py")]:
        offending = {n for n in _imports(path) if n.split(".")[0] == "benchmarks"}
        assert not offending, (f"{path} imports {offending}: benchmarks depend on the library, "
                               "never the reverse (they have their own entry point)")


def test_offline_feature_modules_are_found():
    assert {f"{OFFLINE_FEATURES}.materialize", f"{OFFLINE_FEATURES}.sources",
            f"{OFFLINE_FEATURES}.local_writer", f"{OFFLINE_FEATURES}.redis_writer",
            f"{OFFLINE_FEATURES}.cli"} <= OFFLINE_FEATURE_MODULES


def test_online_half_never_imports_the_offline_feature_job():
    """Serving modules, the online feature store included, never import the nightly job
    (``retrieval.features`` exposes its public names lazily, without an import statement)."""
    for path in (ROOT / "retrieval").rglob("*.py"):
        module = _module_name(path)
        if module in OFFLINE_FEATURE_MODULES or module.startswith(OFFLINE_USERS):
            continue
        offending = {n for n in _imports(path) if n.startswith(OFFLINE_FEATURES)}
        assert not offending, f"{module} imports {offending}: the online half must not"


def test_offline_feature_job_never_imports_the_request_path():
    """The nightly job shares only the feature store's formats and contracts with serving
    (and the Redis link below both)."""
    for module in sorted(OFFLINE_FEATURE_MODULES):
        path = ROOT / Path(*module.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        shared = ("retrieval.features", "retrieval.errors", "retrieval.resilience")
        offending = {n for n in _imports(path)
                     if n.split(".")[0] == "retrieval" and not n.startswith(shared)}
        assert not offending, f"{module} imports {offending}: the offline job must not"


def test_import_retrieval_loads_neither_pyarrow_nor_tqdm():
    code = ("import sys, retrieval; "
            "print(sorted(m for m in ('pyarrow', 'tqdm') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, check=True)
    assert done.stdout.strip() == "[]", f"import retrieval loaded {done.stdout.strip()}"


def _loaded_by(module: str, name: str) -> set[str]:
    """What importing ``name`` from ``module`` runs: the module and the ``__init__`` of each
    subpackage on its path, except the top-level packages and ``module``'s own ancestors
    (already initializing when ``module`` runs), nor ``module`` itself (a package)."""
    parts = name.split(".")
    own = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 2)}
    chain = {".".join(parts[:i]) for i in range(2, len(parts))}
    return ({name} | chain) - own


def test_no_import_cycles_between_modules():
    """Also the cycles that close through a subpackage's ``__init__`` (importing
    ``indexes.sharding.layout`` runs ``indexes/sharding/__init__.py`` and all it imports)."""
    graph: dict[str, set[str]] = {}
    for package in ("indexes", "retrieval"):
        for path in (ROOT / package).rglob("*.py"):
            module = _module_name(path)
            ours = {n for n in _imports(path) if n.split(".")[0] in ("indexes", "retrieval")}
            graph[module] = {loaded for n in ours for loaded in _loaded_by(module, n)}
    top = {"indexes", "retrieval"}
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in graph.get(node, set()) - top:
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(trail + [node, nxt]))
            if nxt in graph and state.get(nxt) is None:
                visit(nxt, trail + [node])
        state[node] = 2

    for module in graph:
        if module not in state:
            visit(module, [])


@pytest.mark.parametrize("package", ["indexes", "retrieval", "retrieval.cache"])
def test_public_names_are_sorted_and_importable(package):
    module = importlib.import_module(package)
    assert module.__all__ == sorted(module.__all__)
    for name in module.__all__:
        assert hasattr(module, name), f"{package}.__all__ names {name} but it is not defined"


def test_readme_map_names_every_folder_and_package():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Map of the code"):]
    section = section[:section.index("\n## ", 1)]
    folders = {p.name for p in ROOT.iterdir()
               if p.is_dir() and not p.name.startswith((".", "build")) and p.name != "__pycache__"
               and any(p.rglob("*.py"))}
    packages = {str(p.parent.relative_to(ROOT)) for p in (ROOT / "retrieval").rglob("__init__.py")}
    for name in sorted(folders | packages):
        assert f"`{name}/`" in section, f"the README's map of the code does not name {name}/"
    for named in re.findall(r"`([a-z_0-9]+)`", section):  # every module it names exists
        candidates = [*ROOT.glob(f"*/{named}.py"), *ROOT.glob(f"*/*/{named}.py"),
                      *ROOT.glob(f"*/*/*/{named}.py"), *ROOT.glob(named)]
        assert candidates or named in {"retrieval", "indexes", "benchmarks", "examples", "tests",
                                       "errors", "pyarrow", "tqdm", "import"}, named
