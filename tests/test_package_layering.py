"""The house: dependencies flow one way (lumos_sim -> estimators -> replay -> chakra_schema) and no two modules
import each other (at module level or inside a function)."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("chakra_schema", "replay", "estimators", "lumos_sim")
LAYER = {name: i for i, name in enumerate(PACKAGES)}


def _imports() -> dict[str, set[str]]:
    modules = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def test_no_two_modules_import_each_other():
    graph = _imports()
    loops = sorted({tuple(sorted((a, b))) for a in graph for b in graph[a] if a in graph.get(b, ())})
    assert loops == [], loops


def test_packages_depend_only_on_the_layers_below():
    wrong = [(a, b) for a, targets in _imports().items() for b in targets
             if LAYER[b.split(".")[0]] > LAYER[a.split(".")[0]]]
    assert wrong == [], wrong
