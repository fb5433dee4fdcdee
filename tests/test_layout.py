"""Package layout rules: import direction, no cycles, sorted public names."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_indexes_never_imports_retrieval():
    for path in (ROOT / "indexes").rglob("*.py"):
        offending = {n for n in _imports(path) if n.split(".")[0] == "retrieval"}
        assert not offending, f"{path} imports {offending}: the offline layer must not"


def test_no_import_cycles_between_modules():
    graph: dict[str, set[str]] = {}
    for package in ("indexes", "retrieval"):
        for path in (ROOT / package).rglob("*.py"):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            module = module.removesuffix(".__init__")
            ours = {n for n in _imports(path) if n.split(".")[0] in ("indexes", "retrieval")}
            graph[module] = ours
    # Package __init__ files only re-export: ignore edges into them to find real cycles.
    packages = {m for m in graph if (ROOT / Path(*m.split("."))).is_dir()}
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in graph.get(node, set()) - packages:
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
