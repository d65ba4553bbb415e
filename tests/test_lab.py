"""JupyterLab and the runner's output: widget progress bars, an HTML copy of every executed notebook, and a quiet
kernel start.

The pipeline test here runs a fake pipeline in a separate process, as `make run` would: copies of notebooks 01 and
02 with their real parameters cells and a few lines each (01 draws a tqdm bar, 02 fails), so that it costs two
kernel starts.
"""

import ast
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from c2llm_lib.notebook import NOTEBOOK_DIR, STAGES, parameters_cell

REPO = Path(__file__).resolve().parent.parent
WIDGET = "application/vnd.jupyter.widget-view+json"

BODIES = {
    "01_data_prep": "import tqdm.auto, tqdm.notebook\n"
    "for _ in tqdm.auto.tqdm(range(3), desc='rows'):\n    pass\n"
    "print('widget bar:', issubclass(tqdm.auto.tqdm, tqdm.notebook.tqdm_notebook))",
    "02_train_lora_contrastive": "print('training starts')\nraise ValueError('the loss is nan at step 3')",
}
RUNNER = """import sys
from pathlib import Path
from c2llm_lib.pipeline import PipelineError, run_pipeline
try:
    run_pipeline(sys.argv[1], only=["01", "02"], outputs=sys.argv[2], notebook_dir=Path(sys.argv[3]))
except PipelineError as err:
    print(f"error: {err}", file=sys.stderr)
"""


def test_the_notebook_extras_are_declared_and_import():
    tomllib = pytest.importorskip("tomllib")
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {d.split(">")[0].split("=")[0].split("<")[0].strip().lower() for d in declared}
    assert {"ipywidgets", "nbconvert"} <= names  # widget bars in JupyterLab; the HTML copies of a run
    import ipywidgets
    import nbconvert

    assert int(ipywidgets.__version__.split(".")[0]) >= 8 and nbconvert.__version__


def _tqdm_imports(path: Path) -> list[str]:
    """The tqdm imports of a module other than `tqdm.auto` (which picks the widget bar inside a kernel)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "tqdm" and a.name != "tqdm.auto"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tqdm":
            if node.module != "tqdm.auto":
                found.append(f"from {node.module} import {', '.join(a.name for a in node.names)}")
    return found


def test_library_progress_bars_are_tqdm_auto():
    modules = sorted((REPO / "c2llm_lib").rglob("*.py"))
    assert any("tqdm.auto" in p.read_text() for p in modules)  # the library draws bars (training, encoding)
    plain = {str(p.relative_to(REPO)): _tqdm_imports(p) for p in modules if _tqdm_imports(p)}
    assert plain == {}, "use `from tqdm.auto import tqdm`: a plain tqdm bar is text in JupyterLab"


def test_a_plain_tqdm_import_is_caught(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import tqdm\nfrom tqdm import trange\nfrom tqdm.auto import tqdm as bar\n")
    assert _tqdm_imports(module) == ["tqdm", "from tqdm import trange"]


@pytest.fixture(scope="module")
def fake_run(tmp_path_factory):
    """(run root, notebook dir, the runner's stdout + stderr) of the fake pipeline's 01 (finishes) and 02 (fails)."""
    tmp = tmp_path_factory.mktemp("lab")
    notebooks = tmp / "notebooks"
    notebooks.mkdir()
    for name in STAGES:  # every notebook: the runner resolves the parameters of all six
        real = nbformat.read(NOTEBOOK_DIR / f"{name}.ipynb", as_version=4)
        index, _ = parameters_cell(NOTEBOOK_DIR / f"{name}.ipynb")
        real.cells = [real.cells[index], nbformat.v4.new_code_cell(BODIES.get(name, "print('done')"))]
        nbformat.write(real, notebooks / f"{name}.ipynb")
    (tmp / "lab.yaml").write_text("seed: 0\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, str(tmp / "lab.yaml"), str(tmp / "outputs"), str(notebooks)],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return tmp / "outputs" / "lab", notebooks, done.stdout + done.stderr


@pytest.mark.slow
def test_the_runner_prints_no_transport_or_parameter_warnings(fake_run):
    _, _, output = fake_run
    assert "error: 02_train_lora_contrastive failed in cell" in output  # the run did start kernels and fail in 02
    assert "without encryption" not in output
    assert "Unable to parse" not in output and "Passed unknown parameter" not in output


@pytest.mark.slow
def test_every_executed_notebook_is_also_saved_as_html(fake_run):
    root, notebooks, output = fake_run
    finished = (root / "notebooks" / "01_data_prep.html").read_text()
    assert finished.lstrip().lower().startswith("<!doctype html") and "widget bar: True" in finished
    failed = (root / "notebooks" / "02_train_lora_contrastive.html").read_text()
    assert "training starts" in failed and "ValueError" in failed and "the loss is nan at step 3" in failed
    assert f"to read in a browser: {root / 'notebooks' / '02_train_lora_contrastive.html'}" in output
    assert not (root / "notebooks" / "03_merge_checkpoints.html").exists()  # not reached
    assert sorted(p.suffix for p in notebooks.iterdir()) == [".ipynb"] * len(STAGES)  # only the run dir is written


@pytest.mark.slow
def test_tqdm_auto_draws_a_widget_bar_in_the_kernel(fake_run):
    root, _, _ = fake_run
    nb = nbformat.read(root / "notebooks" / "01_data_prep.ipynb", as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert any(WIDGET in o.get("data", {}) for o in outputs), "the bar is a widget, not text"
    text = "".join(o.get("text", "") for o in outputs)
    assert "widget bar: True" in text and "IProgress not found" not in text
