"""Prompt sets of C2LLM (table 1 as mteb registers it: CodeTransOceanDL reuses the Contest instruction), jina's and
CodeXEmbed's, for training and evaluation alike (`prompts`).
"""

from __future__ import annotations

from .data.sources import TABLE_1
from .entries import LANGUAGES

DOCUMENT_PREFIX = "Retrieved Answer:"
C2LLM_PROMPTS = {**TABLE_1, "CodeTransOceanDL": TABLE_1["CodeTransOceanContest"]}
JINA_CATEGORIES = {
    "NL2Code": ("Find the most relevant code snippet given the following query:\n", "Candidate code snippet:\n"),
    "TechQA": ("Find the most relevant answer given the following question:\n", "Candidate answer:\n"),
    "Code2Code": ("Find an equivalent code snippet given the following code snippet:\n", "Candidate code snippet:\n"),
    "Code2NL": ("Find the most relevant comment given the following code snippet:\n", "Candidate comment:\n"),
    "Code2Completion": (
        "Find the most relevant completion given the following start of code snippet:\n",
        "Candidate completion:\n",
    ),
}
JINA_TASKS = {  # jina-code-embeddings, appendix: the category of each MTEB(Code) task
    "AppsRetrieval": "NL2Code", "CodeEditSearchRetrieval": "NL2Code", "CodeSearchNetRetrieval": "NL2Code",
    "CosQA": "NL2Code", "SyntheticText2SQL": "NL2Code", "CodeFeedbackMT": "TechQA", "CodeFeedbackST": "TechQA",
    "StackOverflowQA": "TechQA", "CodeTransOceanContest": "Code2Code", "CodeTransOceanDL": "Code2Code",
    "COIRCodeSearchNetRetrieval": "Code2NL", "CodeSearchNetCCRetrieval": "Code2Completion",
}  # fmt: skip
OFFLINE_TASKS = {  # our offline tasks -> the MTEB(Code) task whose recipe made them
    "offline-text2code-python": "CodeSearchNetRetrieval", "offline-text2code-javascript": "CodeSearchNetRetrieval",
    "offline-code2code-python": "CodeSearchNetCCRetrieval", "offline-code2code-javascript": "CodeSearchNetCCRetrieval",
    "HumanEval": "CodeSearchNetRetrieval",
}  # fmt: skip
HELDOUT_RECIPES = {"text2code": "CodeSearchNetRetrieval", "code2code": "CodeSearchNetCCRetrieval"}  # mined code
USER_CATEGORY = "NL2Code"  # jina's category for a name its table does not list (a user's group, a BEIR set)
CODEXEMBED_INSTRUCTION = "Instruct: Given Code or Text, retrieve relevant content. Query:"
STYLES = ("c2llm", "jina", "codexembed")


def recipe_task(task: str) -> str:
    """The task or dataset whose prompts `task` takes: an offline, held-out or unseen task's recipe, else itself."""
    if task in OFFLINE_TASKS:
        return OFFLINE_TASKS[task]
    for short, recipe in HELDOUT_RECIPES.items():
        if task.startswith(f"heldout-{short}-") and task.removeprefix(f"heldout-{short}-") in LANGUAGES:
            return recipe
        if task.startswith(f"unseen-{short}-") and task.removeprefix(f"unseen-{short}-"):
            return recipe
    return task


def prompts(style: str, task: str, document_prefix: str = DOCUMENT_PREFIX) -> tuple[str, str]:
    """(query instruction, document prefix) of a style for a task. A name no set lists gets jina's NL2Code category,
    codexembed's one instruction, or a ValueError in the c2llm style."""
    if style not in STYLES:
        raise ValueError(f"unknown prompt style {style!r}; choose one of {', '.join(STYLES)}")
    if style == "codexembed":  # one instruction for every task
        return CODEXEMBED_INSTRUCTION + " ", ""
    name = recipe_task(task)
    if style == "jina":  # a name jina's table does not list takes the text-to-code category
        return JINA_CATEGORIES[JINA_TASKS.get(name, USER_CATEGORY)]
    if name not in C2LLM_PROMPTS:
        raise ValueError(
            f"no {style} prompts for task {task!r} (the c2llm style takes a user's task's instruction from its rows "
            f"or an override); known: {sorted(C2LLM_PROMPTS) + sorted(OFFLINE_TASKS)}, heldout-text2code-<language>"
            ", heldout-code2code-<language>, unseen-text2code-<package> and unseen-code2code-<package>"
        )
    return C2LLM_PROMPTS[name], document_prefix
