"""Prompt sets of C2LLM and its two peers, mapped to the MTEB(Code, v1) and offline tasks.

- "c2llm" (the paper's table 1, as mteb registers it): one query instruction per dataset, documents prefixed
  with "Retrieved Answer:";
- "jina" (jina-code-embeddings, its table 1): five task categories with their own query and document prefixes.
  The paper's table cuts the Code2Completion query prefix after "start of code"; we complete it as
  "...start of code snippet:\\n" by the pattern of the other four (an inference);
- "codexembed" (CodeXEmbed, its training details): one instruction for every code task,
  "Instruct: Given Code or Text, retrieve relevant content. Query:", and no document prefix.

`prompts(style, task)` gives (query instruction, document prefix) for a task name.
"""

from __future__ import annotations

from .mteb_code import C2LLM_PROMPTS, DOCUMENT_PREFIX

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
CODEXEMBED_INSTRUCTION = "Instruct: Given Code or Text, retrieve relevant content. Query:"
STYLES = ("c2llm", "jina", "codexembed")


def prompts(style: str, task: str) -> tuple[str, str]:
    """(query instruction, document prefix) of a prompt style for an MTEB(Code, v1) or offline task."""
    name = OFFLINE_TASKS.get(task, task)
    if name not in C2LLM_PROMPTS:
        raise ValueError(f"no prompts for task {task!r}; known: {sorted(C2LLM_PROMPTS) + sorted(OFFLINE_TASKS)}")
    if style == "c2llm":
        return C2LLM_PROMPTS[name], DOCUMENT_PREFIX
    if style == "jina":
        return JINA_CATEGORIES[JINA_TASKS[name]]
    if style == "codexembed":
        return CODEXEMBED_INSTRUCTION, ""
    raise ValueError(f"unknown prompt style {style!r}; choose one of {', '.join(STYLES)}")
