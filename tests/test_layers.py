"""The library's layers (docs/layout.md), held: every import of c2llm_lib, function bodies included, relative and
absolute, is read from the source, and a circle between library modules, an import of a higher layer, a
function-level import of one of the library's own modules (but the short allow-list `LAZY`), and any import of
`tools/` fail, each named by file, line and rule. The same functions run on crafted module texts, to show that each
rule catches what it forbids.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import c2llm_lib

PACKAGE = Path(c2llm_lib.__file__).resolve().parent
FACE = "c2llm_lib"  # the package's face (c2llm_lib/__init__.py): C2LLMEncoder, ModelConfig, ConfigError

# module prefix -> layer (the longest prefix naming a module or package wins); a module may import its own layer or a
# lower one. Step 2 of the redesign regroups layers 2 and 3 into packages (eval/, study/) without moving a layer.
LAYERS = {
    # 0 foundations: import nothing of the library
    "c2llm_lib.config": 0, "c2llm_lib.checks": 0, "c2llm_lib.entries": 0, "c2llm_lib.pins": 0, "c2llm_lib.files": 0,
    "c2llm_lib.hardware": 0, "c2llm_lib.distributed": 0, "c2llm_lib.batching": 0,
    # 1 the pieces: losses, prompts, the encoder, the data, the retrieval task shared by data and evaluation
    FACE: 1, "c2llm_lib.losses": 1, "c2llm_lib.prompts": 1, "c2llm_lib.model": 1, "c2llm_lib.data": 1,
    "c2llm_lib.retrieval": 1, "c2llm_lib.downloads": 1,
    # 2 training, merging, export, evaluation
    "c2llm_lib.train": 2, "c2llm_lib.merge": 2, "c2llm_lib.export": 2, "c2llm_lib.eval": 2,
    # 3 figures and attention, the studies, search
    "c2llm_lib.attention": 3, "c2llm_lib.figures": 3, "c2llm_lib.study": 3, "c2llm_lib.search": 3,
    # 4 the runner
    "c2llm_lib.pipeline": 4, "c2llm_lib.params": 4, "c2llm_lib.stages": 4, "c2llm_lib.runs": 4, "c2llm_lib.notebook": 4,
    "c2llm_lib.launch": 4,
}  # fmt: skip

# library modules that may be imported inside a function, each because importing it loads a heavy optional dependency
LAZY = {
    "c2llm_lib.eval.mteb": "imports mteb (about 240 MB and seconds): loaded only where an mteb task or benchmark runs",
    "c2llm_lib.model.st_modules": "imports sentence-transformers (about 150 MB): loaded only to write or read exports",
}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the library module imported, or "tools..."
    line: int
    in_function: bool
    through_package: bool = False  # an implicit edge: importing `a.b.c` runs the package `a.b` first


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def library() -> dict[str, tuple[str, str, bool]]:
    """{module: (file, source, is a package's __init__)} of every library module."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "assets" not in path.relative_to(PACKAGE).parts:
            file = str(path.relative_to(PACKAGE.parent))
            found[module_name(path)] = (file, path.read_text(), path.stem == "__init__")
    return found


def _target(name: str, known: set[str]) -> str:
    """The longest library module that a dotted name names (`c2llm_lib.data.records.text_key` names the module
    `c2llm_lib.data.records`), or the name itself where nothing is known of it."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name


def imports_of(module: str, source: str, is_package: bool, known: set[str]) -> list[Import]:
    """Every import of the library or of tools/ in `source` (module `module`), with its line and whether it lies
    inside a function, plus the implicit imports of the packages above a target (not the importer's own packages)."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[Import] = []

    def add(name: str, line: int, in_function: bool) -> None:
        if name == "tools" or name.startswith("tools."):
            found.append(Import(module, name, line, in_function))
            return
        if name != FACE and not name.startswith(FACE + "."):
            return
        target = _target(name, known)
        if not target or target == module:
            return
        found.append(Import(module, target, line, in_function))
        parts = target.split(".")
        for i in range(2, len(parts)):  # a.b.c runs a.b first: an edge, unless a.b holds the importer itself
            parent = ".".join(parts[:i])
            if parent in known and not (module == parent or module.startswith(parent + ".")):
                found.append(Import(module, parent, line, in_function, through_package=True))

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(alias.name, child.lineno, in_function)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - (child.level - 1)]
                    stem = ".".join(base + ([child.module] if child.module else []))
                else:
                    stem = child.module or ""
                for alias in child.names:  # `from . import released` names a module, `from .x import f` a name
                    add(f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in known else stem, child.lineno, in_function)
            visit(child, inside)

    visit(ast.parse(source), False)
    return list(dict.fromkeys(found))  # `from x import a, b` is one import of x


def layer_of(module: str) -> int | None:
    """The layer of the longest prefix in LAYERS naming `module` or a package above it; the face only by its name."""
    if module == FACE:
        return LAYERS[FACE]
    name = module
    while name and name != FACE:
        if name in LAYERS:
            return LAYERS[name]
        name = name.rpartition(".")[0]
    return None


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return found


def problems(modules: dict[str, tuple[str, str, bool]]) -> list[str]:
    """'file:line: rule: what' for every import that breaks a rule of the layers, in `modules` ({module: (file,
    source, is a package's __init__)})."""
    known = set(modules)
    found, edges, where = [], {m: set() for m in modules}, {}
    for module, (file, source, is_package) in modules.items():
        own = layer_of(module)
        if own is None:
            found.append(f"{file}:1: no layer: add {module} (or its package) to LAYERS in tests/test_layers.py")
        for imp in imports_of(module, source, is_package, known):
            at = f"{file}:{imp.line}"
            if imp.target.split(".")[0] == "tools":
                found.append(f"{at}: imports tools/: the library never imports its tools ({imp.target})")
                continue
            edges[module].add(imp.target)
            where.setdefault((module, imp.target), at)
            if imp.through_package:
                continue
            target = layer_of(imp.target)
            if own is not None and target is not None and target > own:
                found.append(f"{at}: imports a higher layer: {module} (layer {own}) imports {imp.target} "
                             f"(layer {target})")  # fmt: skip
            if imp.in_function and imp.target not in LAZY:
                found.append(f"{at}: function-level import of the library: {imp.target} (import it at the top; "
                             "where that would point up or close a circle, the code is in a wrong place)")  # fmt: skip
    for component in circles(edges):
        ties = [f"{where[(a, b)]} ({a} -> {b})" for a in component for b in sorted(edges[a]) if b in component]
        found.append(f"{ties[0].split(' ')[0]}: import circle: {', '.join(component)}; through {'; '.join(ties)}")
    return found


def test_the_library_stands_in_its_layers():
    found = problems(library())
    assert found == [], "\n".join(found)


def test_every_library_module_has_a_layer_and_the_allow_list_names_real_modules():
    modules = library()
    assert [m for m in modules if layer_of(m) is None] == []
    assert set(LAZY) <= set(modules) and len(LAZY) <= 3  # a short list, each with its reason
    assert all(reason.strip() for reason in LAZY.values())


def test_the_rules_catch_an_upward_import_a_circle_a_function_level_import_and_tools():
    crafted = {
        "c2llm_lib.config": ("c2llm_lib/config.py", "import json\nfrom .export import score\n", False),
        "c2llm_lib.export": ("c2llm_lib/export.py", "from .merge import interval\n", False),
        "c2llm_lib.merge": ("c2llm_lib/merge.py", "def f():\n    from . import export\n", False),
        "c2llm_lib.figures": ("c2llm_lib/figures.py", "import numpy\nfrom tools.scale import plan\n", False),
        "c2llm_lib.search.index": ("c2llm_lib/search/index.py", "def g():\n    import c2llm_lib.eval.mteb\n", False),
        "c2llm_lib.eval.mteb": ("c2llm_lib/eval/mteb.py", "import mteb\n", False),
        "c2llm_lib.data": ("c2llm_lib/data/__init__.py", "from .mix import rows\n", True),
        "c2llm_lib.data.mix": ("c2llm_lib/data/mix.py", "from ..config import ConfigError\n", False),
        "c2llm_lib.data.records": ("c2llm_lib/data/records.py", "X = 1\n", False),
        "c2llm_lib.extra": ("c2llm_lib/extra.py", "", False),
    }
    found = problems(crafted)
    upward = "imports a higher layer: c2llm_lib.config (layer 0) imports c2llm_lib.export (layer 2)"
    assert f"c2llm_lib/config.py:2: {upward}" in found
    assert any(p.startswith("c2llm_lib/merge.py:2: function-level import of the library: c2llm_lib.export")
               for p in found)  # fmt: skip
    assert "c2llm_lib/figures.py:2: imports tools/: the library never imports its tools (tools.scale)" in found
    assert "c2llm_lib/extra.py:1: no layer: add c2llm_lib.extra (or its package) to LAYERS in tests/test_layers.py" in (
        found)  # fmt: skip
    [circle] = [p for p in found if ": import circle: " in p]
    assert ": import circle: c2llm_lib.export, c2llm_lib.merge; through " in circle  # config only points in
    assert "c2llm_lib/export.py:1 (c2llm_lib.export -> c2llm_lib.merge)" in circle
    assert "c2llm_lib/merge.py:2 (c2llm_lib.merge -> c2llm_lib.export)" in circle
    # allowed: a lazy import on the allow-list, a lower layer, one's own package, and third-party modules
    assert not any(p.startswith(("c2llm_lib/search/", "c2llm_lib/eval/mteb.py", "c2llm_lib/data/")) for p in found)
    assert len(found) == 5, "\n".join(found)


def test_an_import_through_a_package_closes_a_circle():
    """Importing `c2llm_lib.data.records` runs `c2llm_lib/data/__init__.py` first: a circle through it is one."""
    crafted = {
        "c2llm_lib.data": ("c2llm_lib/data/__init__.py", "from .mix import rows\n", True),
        "c2llm_lib.data.mix": ("c2llm_lib/data/mix.py", "from ..prompts import prompts\n", False),
        "c2llm_lib.data.records": ("c2llm_lib/data/records.py", "X = 1\n", False),
        "c2llm_lib.prompts": ("c2llm_lib/prompts.py", "from .data.records import X\n", False),
    }
    [circle] = problems(crafted)
    assert ": import circle: c2llm_lib.data, c2llm_lib.data.mix, c2llm_lib.prompts" in circle
