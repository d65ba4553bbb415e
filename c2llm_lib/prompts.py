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
our offline tasks, or a training dataset of the same name). Training (`train.Trainer`) and evaluation
(`mteb_code.MTEBEncoder`) both call it with the encoder's `prompt_style`, so a model is evaluated with the
prompts it was trained with.
"""

from __future__ import annotations

from .data.sources import TABLE_1

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
CODEXEMBED_INSTRUCTION = "Instruct: Given Code or Text, retrieve relevant content. Query:"
STYLES = ("c2llm", "jina", "codexembed")


def prompts(style: str, task: str, document_prefix: str = DOCUMENT_PREFIX) -> tuple[str, str]:
    """(query instruction, document prefix) of a prompt style for a task; `document_prefix` is the c2llm style's
    (an encoder passes its configured one). An instruction ending in a space or newline is used as is; the
    encoder puts a newline after any other."""
    if style not in STYLES:
        raise ValueError(f"unknown prompt style {style!r}; choose one of {', '.join(STYLES)}")
    if style == "codexembed":  # one instruction for every task
        return CODEXEMBED_INSTRUCTION + " ", ""
    name = OFFLINE_TASKS.get(task, task)
    if name not in C2LLM_PROMPTS:
        raise ValueError(
            f"no {style} prompts for task {task!r}; known: {sorted(C2LLM_PROMPTS) + sorted(OFFLINE_TASKS)}"
        )
    if style == "c2llm":
        return C2LLM_PROMPTS[name], document_prefix
    return JINA_CATEGORIES[JINA_TASKS[name]]
