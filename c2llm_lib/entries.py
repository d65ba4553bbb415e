"""`data_files` entries (`data_source: files`) and the languages a record may name, checked when params are read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .checks import ConfigError, unknown_keys

# each entry a path or {path, instruction, group, language}
ENTRY_KEYS = ("path", "instruction", "group", "language")
# the languages a record may name: a row's own (data/records.py checks each row) or its data_files entry's
LANGUAGES = frozenset(
    {
        "python", "javascript", "typescript", "java", "go", "ruby", "php", "c", "c++", "c#", "rust",
        "swift", "kotlin", "scala", "shell", "sql", "r", "perl", "lua", "haskell", "mixed",
    }
)  # fmt: skip


@dataclass(frozen=True)
class FileEntry:
    """One `data_files` entry: a path and what its rows do not say themselves."""

    path: str
    instruction: str | None = None  # for rows without a prompt/instruction of their own
    group: str | None = None  # the group (dataset) name of every row; None: the file's stem
    group_column: str | None = None  # split the file into groups by this column's values instead
    language: str | None = None  # for rows without a language of their own


def file_entries(data_files: Any) -> list[FileEntry]:
    """The `data_files` parameter (paths and mappings from YAML) as `FileEntry`s; a bad one is a `ConfigError`."""
    if not isinstance(data_files, list):
        raise ConfigError(
            f"parameter 'data_files' must be a list of paths or {{path, instruction, group, language}} mappings, "
            f"got {type(data_files).__name__} {data_files!r}"
        )
    return [_entry(i, value) for i, value in enumerate(data_files)]


def _entry(i: int, value: Any) -> FileEntry:
    where = f"parameter 'data_files' entry {i}"
    if isinstance(value, str):
        value = {"path": value}
    if not isinstance(value, dict):
        raise ConfigError(
            f"{where} must be a path or a mapping with keys {', '.join(ENTRY_KEYS)}, got {type(value).__name__} "
            f"{value!r}"
        )
    unknown = sorted(str(k) for k in value if k not in ENTRY_KEYS)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {unknown_keys(unknown, set(ENTRY_KEYS))}; keys: {', '.join(ENTRY_KEYS)}"
        )
    if "path" not in value:
        raise ConfigError(f"{where}: key 'path' is missing (the file or folder to read), got {value!r}")
    path, instruction, language = value["path"], value.get("instruction"), value.get("language")
    if not isinstance(path, str) or not path.strip():
        raise ConfigError(f"{where}: key 'path' must be a non-empty path, got {path!r}")
    if instruction is not None and (not isinstance(instruction, str) or not instruction.strip()):
        raise ConfigError(f"{where}: key 'instruction' must be a non-empty text, got {instruction!r}")
    if language is not None and (not isinstance(language, str) or language.strip().lower() not in LANGUAGES):
        raise ConfigError(f"{where}: key 'language' must be one of {sorted(LANGUAGES)}, got {language!r}")
    group, column = _group(where, value.get("group"))
    language = language.strip().lower() if language is not None else None
    return FileEntry(path, instruction, group, column, language)


def _group(where: str, group: Any) -> tuple[str | None, str | None]:
    """(group name, group column) of an entry's `group`: a name, or {column: <a column of the file>}."""
    if group is None:
        return None, None
    if isinstance(group, str) and group.strip():
        return group, None
    if isinstance(group, dict) and set(group) == {"column"} and isinstance(group["column"], str):
        if group["column"].strip():
            return None, group["column"]
    raise ConfigError(
        f"{where}: key 'group' must be a group name (a non-empty text) or {{column: <column name>}} to split the file "
        f"by that column's values, got {group!r}"
    )
