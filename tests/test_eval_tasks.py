"""Evaluation on a run's own held-out split (`data/heldout` of a files or code run): the tasks it makes, known answers
of which documents and qrels each holds, their names and instructions, and the offline tasks kept for the others."""

import json
import random
from pathlib import Path

import pytest

from c2llm_lib.data.records import DataError
from c2llm_lib.data.sources import TABLE_1
from c2llm_lib.eval.mteb import task_fingerprint
from c2llm_lib.eval.tasks import (
    contamination_note,
    evaluation_tasks,
    heldout_task_names,
    heldout_tasks,
    instruction_overrides,
    offline_tasks,
    task_sizes,
)

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = {n: json.loads(next((REPO / "notebooks").glob(f"{n}_*.ipynb")).read_text()) for n in ("01", "04")}
FILES = "Given a query, retrieve relevant code or text that answers it:"


def row(dataset, language, query, positive, instruction=FILES):
    return {"dataset": dataset, "language": language, "query": query, "positive": positive, "negatives": [],
            "instruction": instruction, "file": "pairs.jsonl", "row": 0}  # fmt: skip


ROWS = [
    row("pairs", "python", "read json", "def load(p): ..."),
    row("pairs", "python", "count words", "def count(t): ..."),
    row("pairs", "python", "read json", "def load_json(p): ..."),  # the same query, a second positive
    row("pairs", "python", "parse json", "def load(p): ..."),  # the same document, a second query
    row("pairs", "python", "sum a list", "def total(xs): ...", instruction="Find the function:"),
    row("pairs", "go", "reverse a slice", "func Reverse(s []int) {}"),
    row("tickets", "mixed", "login fails", "check the session cookie"),
]


def test_heldout_tasks_known_answer():
    tasks = {t.name: t for t in heldout_tasks(ROWS)}
    assert list(tasks) == ["heldout-pairs-go", "heldout-pairs-python", "heldout-tickets-mixed"]
    python = tasks["heldout-pairs-python"]
    assert python.queries == {"q0": "read json", "q1": "count words", "q2": "parse json", "q3": "sum a list"}
    assert python.corpus == {"d0": "def load(p): ...", "d1": "def count(t): ...", "d2": "def load_json(p): ...",
                             "d3": "def total(xs): ..."}  # fmt: skip
    assert python.qrels == {"q0": {"d0": 1, "d2": 1}, "q1": {"d1": 1}, "q2": {"d0": 1}, "q3": {"d3": 1}}
    assert python.instruction == FILES  # the group's most frequent instruction
    assert tasks["heldout-pairs-go"].corpus == {"d0": "func Reverse(s []int) {}"}
    assert task_sizes(tasks.values())["heldout-pairs-python"] == {"queries": 4, "documents": 4}
    limited = {t.name: t for t in heldout_tasks(ROWS, limit=1)}["heldout-pairs-python"]
    assert len(limited.queries) == 1 and limited.corpus == python.corpus  # the corpus stays whole
    assert limited.qrels == {q: python.qrels[q] for q in limited.queries}


def test_the_limit_draws_its_queries_across_the_split_whatever_the_order_of_its_files():
    """eval_limit took the first N queries: in a code run the alphabetically first held-out files, not a sample."""
    rows = [row("pairs", "python", f"query {i}", f"document {i}") | {"file": f"f{i // 5:02}.py"} for i in range(60)]
    (full,) = heldout_tasks(rows)
    (task,) = heldout_tasks(rows, limit=10)
    drawn = set(task.queries.values())
    assert len(drawn) == 10 and drawn != {f"query {i}" for i in range(10)}  # not the first two files
    assert len({int(q.split()[1]) // 5 for q in drawn}) > 4  # from across the split's files
    assert task.qrels == {q: full.qrels[q] for q in task.queries} and task.corpus == full.corpus
    assert list(task.queries) == [q for q in full.queries if q in task.queries]  # in the task's order
    for order in (rows[::-1], random.Random(3).sample(rows, len(rows))):  # the files read in another order
        assert set(heldout_tasks(order, limit=10)[0].queries.values()) == drawn
    assert heldout_tasks(rows, limit=10)[0] == task  # the same on every run
    other = heldout_tasks(rows, limit=10, seed=1)[0]
    assert set(other.queries.values()) != drawn  # the seed draws
    assert task_fingerprint(other) != task_fingerprint(task)  # mteb's cache and notebook 06's keys follow the draw
    assert (task.split_queries, task.seed) == (60, 0) and (full.split_queries, full.seed) == (None, None)
    assert task_sizes([task])[task.name] == {"queries": 10, "documents": 60, "queries in the split": 60, "seed": 0}
    (positives,) = heldout_tasks(rows, limit=10, max_documents=12)  # every drawn query's positive is in the corpus
    assert positives.queries == task.queries and len(positives.corpus) == 12
    assert all(d in positives.corpus for relevant in positives.qrels.values() for d in relevant)


def test_max_documents_keeps_the_evaluated_positives_and_samples_the_rest():
    rows = [row("pairs", "python", f"query {i}", f"document {i}") for i in range(30)]
    (task,) = heldout_tasks(rows, limit=2, max_documents=10)
    assert len(task.corpus) == 10 and {d for r in task.qrels.values() for d in r} <= set(task.corpus)
    assert [t.corpus for t in heldout_tasks(rows, limit=2, max_documents=10)] == [task.corpus]  # fixed
    assert heldout_tasks(rows, limit=2, max_documents=10, seed=1)[0].corpus != task.corpus


def test_task_names_for_code_recipes_and_user_groups():
    groups = [("CodeSearchNetRetrieval", "go"), ("CodeSearchNetCCRetrieval", "c++"), ("my pairs/v2", "python"),
              ("text2code", "python"), ("a b", "x"), ("a/b", "x")]  # fmt: skip
    names = heldout_task_names(groups)
    assert names[("CodeSearchNetRetrieval", "go")] == "heldout-text2code-go"
    assert names[("CodeSearchNetCCRetrieval", "c++")] == "heldout-code2code-c++"
    assert names[("my pairs/v2", "python")] == "heldout-my-pairs-v2-python"  # a file name in mteb's cache
    assert names[("text2code", "python")] == "heldout-files-text2code-python"  # never read as the code recipe
    assert sorted([names[("a b", "x")], names[("a/b", "x")]]) == ["heldout-a-b-x", "heldout-a-b-x-2"]


def test_a_code_runs_heldout_split_makes_one_task_per_recipe_and_language():
    from c2llm_lib.data.code_trees import prepare_code

    heldout = prepare_code([str(REPO / "tests" / "fixtures" / "own-code")]).heldout
    tasks = {t.name: t for t in evaluation_tasks(heldout, limit=3)}
    groups = {(r["dataset"], r["language"]) for r in heldout}
    assert len(tasks) == len(groups) and "HumanEval" not in tasks  # HumanEval measures the offline recipe only
    assert {"heldout-text2code-go", "heldout-code2code-go", "heldout-text2code-python"} <= set(tasks)
    for (dataset, language), name in heldout_task_names(groups).items():
        task = tasks[name]
        positives = {r["positive"] for r in heldout if (r["dataset"], r["language"]) == (dataset, language)}
        assert set(task.corpus.values()) == positives  # every held-out positive of the group, each once
        assert len(task.queries) == min(3, len({r["query"] for r in heldout if r["dataset"] == dataset
                                                and r["language"] == language}))  # fmt: skip
        assert task.instruction == TABLE_1[dataset]
    code_instructions = instruction_overrides(_config("c2llm"), list(tasks.values()))
    assert code_instructions == {}  # table 1's instructions: what the c2llm prompt set gives these tasks anyway


def test_a_files_task_is_evaluated_with_its_own_instruction_in_the_c2llm_style():
    from c2llm_lib.eval.tasks import task_prompts

    tasks = heldout_tasks(ROWS)
    overrides = instruction_overrides(_config("c2llm"), tasks)
    assert overrides == {t.name: FILES for t in tasks}
    assert task_prompts(_config("c2llm"), "heldout-pairs-python", overrides) == (FILES, "Retrieved Answer:")
    assert instruction_overrides(_config("jina"), tasks) == {}  # jina evaluates as it trained: its NL2Code prefixes


def test_without_a_heldout_split_the_offline_tasks_and_humaneval():
    assert [t.name for t in evaluation_tasks(None, limit=2)] == [t.name for t in offline_tasks(limit=2)]
    assert "HumanEval" in [t.name for t in evaluation_tasks(None, limit=2)]


def test_an_empty_or_foreign_heldout_split_is_an_error():
    with pytest.raises(DataError, match="the held-out split has no rows"):
        heldout_tasks([])
    with pytest.raises(DataError, match=r"no column \['instruction'\]"):
        heldout_tasks([{k: v for k, v in ROWS[0].items() if k != "instruction"}])


def _config(style):
    from c2llm_lib.config import ModelConfig

    return ModelConfig(backbone="tiny-random-qwen2", prompt_style=style)


def test_the_sets_the_training_was_not_checked_against_are_named():
    """Notebook 04 scored mteb_tasks and BEIR sets that notebook 01 had not decontaminated against (decontaminate_mteb
    is false by default) and said nothing."""
    from c2llm_lib.config import DataStage
    from c2llm_lib.data.build import decontaminated_mteb_tasks
    from c2llm_lib.eval.benchmarks import MTEB_CODE_TASKS

    evaluated = ["offline-text2code-python", "HumanEval", "heldout-text2code-go", "beir-mine", "CosQA", "CosQA",
                 "CoREB-Text2Code"]  # fmt: skip
    unchecked = {"decontaminated_mteb_tasks": decontaminated_mteb_tasks(DataStage())}
    assert decontaminated_mteb_tasks(DataStage()) == [] and "CosQA" not in decontaminated_mteb_tasks(DataStage())
    note = contamination_note(evaluated, unchecked, "run r")
    assert note.startswith("**Not checked for contamination**: the training rows of run r were not decontaminated "
                           "against beir-mine, CosQA, CoREB-Text2Code (")  # fmt: skip
    checked = {"decontaminated_mteb_tasks": decontaminated_mteb_tasks(DataStage(decontaminate_mteb=True))}
    assert set(checked["decontaminated_mteb_tasks"]) == set(MTEB_CODE_TASKS)
    assert "against beir-mine, CoREB-Text2Code (" in contamination_note(evaluated, checked, "run r")
    assert contamination_note(evaluated[:3] + ["CosQA"], checked, "run r") == ""  # every evaluated set checked
    released = contamination_note(evaluated[:2], None, "released x")  # its training data is not ours
    assert "against offline-text2code-python, HumanEval (its training data was not prepared here" in released
    assert "does not record which MTEB tasks" in contamination_note(["CosQA"], {"rows": 3}, "run r")  # an old record


def test_notebook_04_reads_what_notebook_01_recorded():
    from c2llm_lib.runs import INPUTS, PRODUCERS, upstream

    assert "metrics/data.json" in INPUTS["04_eval_mteb_code"]  # a rerun of 01 makes 04's note stale, so 04 reruns
    assert upstream("04_eval_mteb_code")["metrics/data.json"] == PRODUCERS["metrics/data.json"] == "01_data_prep"
    cells = {name: "".join("".join(c["source"]) for c in nb["cells"]) for name, nb in NOTEBOOKS.items()}
    assert '"decontaminated_mteb_tasks": decontaminated_mteb_tasks(data)' in cells["01"]
    assert "contamination_note(" in cells["04"] and 'save_text("results.md"' in cells["04"]
