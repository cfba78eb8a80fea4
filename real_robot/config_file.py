"""Configuration files of the robot side (safety limits, a ROS arm's topics): one reader, so a
folder, a binary file or a syntax error is reported the same way, naming the file."""

from __future__ import annotations

import json
from pathlib import Path


def read_mapping_file(path: str | Path, what: str) -> dict:
    """The mapping in a YAML file (JSON for ``.json``); ``{}`` for an empty file.

    Args:
        what: what the mapping holds, for the messages ("limit names to values").

    Raises:
        FileNotFoundError: no such file.
        ValueError: a folder, a file that is not text, not valid YAML/JSON or not a mapping; the message names
            the file.
    """
    path = Path(path)
    must = f"it must be a YAML/JSON mapping of {what}"
    if path.is_dir():
        raise ValueError(f"{path} is a folder, not a file; {must}")
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a text file; {must}") from None
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON (line {e.lineno}: {e.msg}); {must}") from None
    else:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            # PyYAML's own text spans several lines (a caret under the offending column)
            problem = getattr(e, "problem", None) or getattr(e, "reason", None) or str(e).splitlines()[0]
            where = f"line {mark.line + 1}: " if mark is not None else ""
            raise ValueError(f"{path} is not valid YAML ({where}{problem}); {must}") from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a mapping of {what}, got {type(data).__name__}")
    return data
