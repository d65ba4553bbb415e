"""The evaluation package depends one way: only `eval.benchmarks` imports `eval.mteb` (and mteb) at the top,
`eval.tables` imports it inside a function, and nothing `eval.mteb` imports reaches it again."""

import ast
from pathlib import Path

import c2llm_lib

PACKAGE = Path(c2llm_lib.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def nodes(tree: ast.AST, top_level: bool):
    """Every node of `tree`, or with `top_level` those outside function bodies."""
    for node in ast.iter_child_nodes(tree):
        if top_level and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        yield node
        yield from nodes(node, top_level)


def imports_of(path: Path, top_level: bool = False) -> set[str]:
    """c2llm_lib modules imported anywhere in a file (top level or inside functions), or at its top level only."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in nodes(ast.parse(path.read_text()), top_level):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("c2llm_lib")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            elif node.module and node.module.startswith("c2llm_lib"):
                target = node.module
            else:
                continue
            found.add(target)
            found |= {f"{target}.{a.name}" for a in node.names}  # `from . import released` names a module
    return found


def import_graph(top_level: bool = False) -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        edges = set()
        for target in imports_of(path, top_level):
            while target and target not in files:  # `from .x import f` names a function, not a module
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
                parts = target.split(".")  # importing a.b.c runs a/__init__ and a/b/__init__ too
                edges |= {".".join(parts[:i]) for i in range(2, len(parts)) if ".".join(parts[:i]) in files}
        graph[name] = edges
    return graph


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def test_mteb_is_imported_at_the_top_only_by_benchmarks_and_never_reaches_itself():
    assert "c2llm_lib.eval.mteb" in import_graph()["c2llm_lib.eval.tables"]  # inside `evaluate_set`
    graph = import_graph(top_level=True)
    assert {m for m, edges in graph.items() if "c2llm_lib.eval.mteb" in edges} == {"c2llm_lib.eval.benchmarks"}
    path = reachable(graph, "c2llm_lib.eval.mteb")
    assert "c2llm_lib.eval.mteb" not in path, "eval.mteb imports a module that imports it (directly or not)"


def test_the_shared_pieces_are_still_importable_from_eval():
    from c2llm_lib import eval as evaluation
    from c2llm_lib import retrieval

    assert evaluation.RetrievalTask is retrieval.RetrievalTask
    assert evaluation.truncate is retrieval.truncate and evaluation.corpus_text is retrieval.corpus_text
