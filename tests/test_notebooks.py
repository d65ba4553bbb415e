"""Notebook hygiene: stripped, one literal parameters cell matching its stage, no definitions or shell escapes."""

import ast

import nbformat
import pytest

from c2llm_lib.notebook import NOTEBOOK_DIR, STAGES, read_parameters, stage_keys

NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))


def test_the_notebooks_exist_in_stage_order():
    assert [p.stem for p in NOTEBOOKS] == list(STAGES)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_hygiene(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), "outputs are not stripped"
    assert nb.cells[0].cell_type == "markdown" and "**Headless.**" in nb.cells[0].source
    tagged = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "exactly one parameters cell"
    assert "open_stage(globals()" in nb.cells[tagged[0] + 1].source, "the stage opens right after the parameters"
    assert sorted(read_parameters(path)) == sorted(stage_keys(path.stem))
    for cell in code:
        assert not cell.source.lstrip().startswith(("!", "%pip", "%conda")), "no shell or install cells"
        tree = ast.parse(cell.source)
        for node in ast.walk(tree):
            assert not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)), (
                f"a definition in a pipeline notebook: {cell.source[:60]!r}"
            )
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in ("input", "exec", "eval"), node.func.id
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "## Summary" in text and "## Exercises" in text
    assert "section" in text.lower(), "the markdown cites the paper"


def test_a_non_literal_parameter_is_refused(tmp_path):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("run: str = 'x'\nsteps: int = 2 * 5")
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell]
    nbformat.write(nb, tmp_path / "bad.ipynb")
    from c2llm_lib.checks import ConfigError

    with pytest.raises(ConfigError, match="'steps' is not a literal"):
        read_parameters(tmp_path / "bad.ipynb")
