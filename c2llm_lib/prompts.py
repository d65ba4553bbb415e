"""Prompt sets of C2LLM and its two peers, mapped to the MTEB(Code, v1) and offline tasks.

- "c2llm" (the paper's table 1, as mteb registers C2LLM): one query instruction per dataset, documents
  prefixed with the encoder's `document_prefix` ("Retrieved Answer:", no separator). The registration reuses
  the Contest instruction for CodeTransOceanDL (table 1 has its own); the published scores were made with the
  registration, so evaluation follows it;
- "jina" (jina-code-embeddings, its table 1): five task categories, each with a query and a document
  prefix. The page layout of the paper's table splits the Code2Completion query prefix: its tail
  "snippet:\\n" is printed below the table;
- "codexembed" (CodeXEmbed, appendix A.2): one instruction before every code query,
  "Instruct: Given Code or Text, retrieve relevant content. Query:", followed by a space and the query
  (our reading of "prepend ... in the format"), and no document prefix.

`prompts(style, task)` gives (query instruction, document prefix) for a task (an MTEB(Code) task, one of
our offline tasks, a run's held-out task, or a training dataset of the same name). Training (`train.Trainer`) and
evaluation (`eval.mteb.MTEBEncoder`) both call it with the encoder's `prompt_style`, so a model is evaluated with the
prompts it was trained with. A held-out task of a `code` run (`heldout-text2code-<language>`,
`heldout-code2code-<language>`, `eval.tasks.heldout_tasks`) and a task of an unseen library
(`unseen-text2code-<package>`, `unseen-code2code-<package>`, `eval.tasks.unseen_tasks`) take the prompts of the
recipe that mined them (`recipe_task`).

Names no prompt set lists (a user's own group in a `files` run, its held-out tasks, a local BEIR set, a task of
another mteb benchmark): the jina style gives them its text-to-code category, NL2Code (`USER_CATEGORY`): a user's
pairs are queries for code or text, and the category's prefixes ask for "the most relevant code snippet"; the same
fallback in training and in evaluation keeps the two alike. The codexembed style has one instruction for every task.
The c2llm style raises for them: it trains on each row's own instruction, and evaluation gives such a task its own
instruction (`eval.tasks.task_prompts` with the task's override, `eval.tasks.instruction_overrides`).
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
    """The task or dataset whose prompts `task` takes: an offline task's recipe (`OFFLINE_TASKS`), a code run's
    held-out task's recipe (`heldout-text2code-<language>` -> CodeSearchNetRetrieval, `heldout-code2code-<language>`
    -> CodeSearchNetCCRetrieval), an unseen library's task's (`unseen-text2code-<package>`,
    `unseen-code2code-<package>`), else `task` itself."""
    if task in OFFLINE_TASKS:
        return OFFLINE_TASKS[task]
    for short, recipe in HELDOUT_RECIPES.items():
        if task.startswith(f"heldout-{short}-") and task.removeprefix(f"heldout-{short}-") in LANGUAGES:
            return recipe
        if task.startswith(f"unseen-{short}-") and task.removeprefix(f"unseen-{short}-"):
            return recipe
    return task


def prompts(style: str, task: str, document_prefix: str = DOCUMENT_PREFIX) -> tuple[str, str]:
    """(query instruction, document prefix) of a prompt style for a task; `document_prefix` is the c2llm style's
    (an encoder passes its configured one). An instruction ending in a space or newline is used as is; the
    encoder puts a newline after any other. A name the style's set does not list: jina's `USER_CATEGORY`, and a
    ValueError naming it for the c2llm style (see the module docstring)."""
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
