"""The evaluation modules depend one way: `eval` imports `mteb_code`, and nothing `mteb_code` imports reaches `eval`."""

import ast
from pathlib import Path

import c2llm_lib

PACKAGE = Path(c2llm_lib.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """c2llm_lib modules imported anywhere in a file (top level or inside functions)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
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


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        edges = set()
        for target in imports_of(path):
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


def test_mteb_code_never_reaches_eval():
    graph = import_graph()
    assert "c2llm_lib.mteb_code" in graph["c2llm_lib.eval"]  # the one direction
    path = reachable(graph, "c2llm_lib.mteb_code")
    assert "c2llm_lib.eval" not in path, "mteb_code imports eval (directly or through another module)"


def test_the_shared_pieces_are_still_importable_from_eval():
    from c2llm_lib import eval as evaluation
    from c2llm_lib import retrieval

    assert evaluation.RetrievalTask is retrieval.RetrievalTask
    assert evaluation.truncate is retrieval.truncate and evaluation.corpus_text is retrieval.corpus_text
