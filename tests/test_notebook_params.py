"""The parameters cells as papermill reads them: `papermill --help-notebook` lists every parameter with its type,
default and help, and papermill's parser warns about nothing; and one default per key: each cell's default is its
stage dataclass field's default, and a key several notebooks declare has the same default in each.

papermill does not run the cell; it reads each line with a regular expression (`PythonTranslator.inspect`), which
is stricter than Python. A line it cannot read is either dropped with a warning (`Unable to parse line N`, for a
second `=` on the line) or dropped silently (an annotation with `|`, such as `int | None`). So each parameter line
follows one rule, checked here on every notebook:

    name: TYPE = LITERAL  # help

- TYPE is a builtin type, bare or subscripted (`int`, `str`, `list[str]`, `dict[str, float]`); a parameter that
  may be None has it quoted as `"Optional[int]"` (never `int | None`: papermill cannot read `|`, and a quoted
  annotation needs no import in the cell);
- the line holds exactly one `=` and one `#`: none in the help text or in a string value;
- the help is not empty and does not start with `type:` (papermill reads that as a type comment);
- a long list may continue on the following lines, with no `=` or comment on them; its help goes on its last line.
"""

import ast
import dataclasses
import logging

import nbformat
import papermill
import pytest

from c2llm_lib.notebook import NOTEBOOK_DIR, RUN_KEYS, STAGES, read_parameters

NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
TYPE_NAMES = {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "dict"}


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            self.messages.append(record.getMessage())


def _fits(value, kind: str) -> bool:
    """Whether a default fits the annotation papermill read: `int` for 3, `list[str]` for [], `Optional[int]` for
    None or 3 (an int literal also fits `float`)."""
    optional = kind.startswith("Optional[") and kind.endswith("]")
    if value is None:
        return optional
    outer = (kind[len("Optional[") : -1] if optional else kind).split("[")[0].strip()
    return outer == TYPE_NAMES.get(type(value)) or (outer == "float" and type(value) is int)


def papermill_problems(path) -> list[str]:
    """What is wrong with a notebook's parameters cell as papermill reads it (what `--help-notebook` prints)."""
    declared = read_parameters(path)  # {name: default} as Python reads the cell
    handler = _Records()
    logger = logging.getLogger("papermill")
    logger.addHandler(handler)
    try:
        inferred = papermill.inspect_notebook(str(path))
    finally:
        logger.removeHandler(handler)
    problems = [f"papermill warns: {m}" for m in handler.messages]
    problems += [f"{name}: papermill does not see it" for name in declared if name not in inferred]
    for name, found in inferred.items():
        if name not in declared:
            problems.append(f"{name}: papermill sees a parameter Python does not")
            continue
        kind = found["inferred_type_name"]
        if kind in ("", "None"):
            problems.append(f"{name}: no type")
        elif not _fits(declared[name], kind):
            problems.append(f"{name}: the type {kind!r} does not fit the default {declared[name]!r}")
        if not found["help"]:
            problems.append(f"{name}: no help text (a `# comment` on its line)")
        try:
            default = ast.literal_eval(found["default"])
        except (ValueError, SyntaxError):
            problems.append(f"{name}: papermill reads the default as {found['default']!r}, not a literal")
        else:
            if default != declared[name]:
                problems.append(f"{name}: papermill reads the default as {default!r}, Python as {declared[name]!r}")
    return problems


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_papermill_reads_every_parameter_with_its_type_and_help(path):
    assert papermill_problems(path) == []


def test_papermill_help_lists_every_parameter_without_a_warning(capfd):
    """The command line a reader uses: `papermill --help-notebook` prints each name with its type and help."""
    from click.testing import CliRunner
    from papermill.cli import papermill as cli

    path = NOTEBOOK_DIR / "02_train_lora_contrastive.ipynb"
    result = CliRunner().invoke(cli, ["--help-notebook", str(path)])
    assert result.exit_code == 0, result.output
    assert "Unable to parse" not in result.output + capfd.readouterr().err
    for name in read_parameters(path):
        assert f"  {name}: " in result.output, name
    assert "  embedding_dim: Optional[int] (default None)" in result.output
    assert "None: the backbone's hidden size" in result.output


def _cell(tmp_path, source: str):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "cell.ipynb"
    nbformat.write(nb, path)
    return path


GOOD = (
    'run: str = "x"  # the run\nsizes: list[int] = [1,\n    2]  # two sizes\ncap: "Optional[int]" = None  # None: none'
)


def test_a_cell_that_follows_the_rule_passes(tmp_path):
    assert papermill_problems(_cell(tmp_path, GOOD)) == []


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("limit: int | None = 3  # a limit", "limit: papermill does not see it"),  # `|`: dropped silently
        ("dim: 'Optional[int]' = None  # None = the hidden size", "papermill warns: Unable to parse line 5"),
        ("prefix: str = 'a=b'  # a prefix", "papermill warns: Unable to parse line 5"),
        ("limit: int = 3", "limit: no help text"),
        ("limit: int = None  # a limit", "limit: the type 'int' does not fit the default None"),
        ("limit: 'Optional[str]' = 3  # a limit", "limit: the type 'Optional[str]' does not fit the default 3"),
        ("tag: str = 'a#b'  # a tag", "tag: papermill reads the default as"),
        ("names: list[str] = ['a',  # first\n    'b']", "names: no help text"),
    ],
)
def test_a_line_that_breaks_the_rule_is_caught(tmp_path, line, problem):
    problems = papermill_problems(_cell(tmp_path, GOOD + "\n" + line))
    assert any(p.startswith(problem) for p in problems), problems


def field_default(field: dataclasses.Field):
    return field.default_factory() if field.default is dataclasses.MISSING else field.default


def default_differences() -> list[str]:
    """'notebook: key = cell default in the cell, dataclass default in Class' for every key whose notebook cell (read
    as the runner reads it) and stage dataclass give different defaults; a type counts (True is not 1, 1 not 1.0)."""
    out = []
    for name, classes in STAGES.items():
        cell = read_parameters(NOTEBOOK_DIR / f"{name}.ipynb")
        for cls in classes:
            for field in dataclasses.fields(cls):
                ours, theirs = cell.get(field.name, "(not declared)"), field_default(field)
                if (type(ours), ours) != (type(theirs), theirs):
                    out.append(f"{name}: {field.name} = {ours!r} in the cell, {theirs!r} in {cls.__name__}")
    return out


def test_every_cell_default_is_its_dataclass_default():
    """One default per key (DESIGN.md): the cell is what a reader sees and what a run that does not set the key uses,
    and the dataclass is what the library uses when called directly; they are the same value."""
    assert default_differences() == []


def test_a_key_several_notebooks_declare_has_one_default():
    """A shared key (eval_limit in notebooks 04 and 06, eval_max_length in 03, 04 and 06, num_negatives in 01 and 02)
    gets one value from the runner when a params file sets it, and each notebook's own default when it does not: the
    defaults agree, so a run that leaves the key unset evaluates (or mines and trains) alike in every notebook."""
    seen: dict[str, dict[str, object]] = {}
    for name in STAGES:
        for key, value in read_parameters(NOTEBOOK_DIR / f"{name}.ipynb").items():
            if key not in RUN_KEYS:
                seen.setdefault(key, {})[name] = value
    shared = {key: found for key, found in seen.items() if len(found) > 1}
    assert {"eval_limit", "eval_max_length", "num_negatives", "data_source"} <= set(shared)
    assert {key: found for key, found in shared.items() if len({repr(v) for v in found.values()}) > 1} == {}
