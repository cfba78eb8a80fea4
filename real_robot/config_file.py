"""Configuration files of the robot side (safety limits, a ROS arm's topics): one reader, so a
folder, a binary file or a syntax error is reported the same way, naming the file."""

from __future__ import annotations

import json
import re
from pathlib import Path

# YAML 1.1 (PyYAML) reads 1e-2 as a string and 1.0e-2 as a float; YAML 1.2 and JSON read both as numbers
_FLOAT_1_2 = re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")


class _DuplicateKey(ValueError):
    pass


def _json_pairs(pairs: list) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _yaml_loader():
    """PyYAML's safe loader, refusing a key given twice (the later would silently win) and reading
    exponent numbers without a dot (``1e-2``) as floats."""
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise _DuplicateKey(f"{key} (line {key_node.start_mark.line + 1})")
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_1_2, list("-+0123456789"))
    return Loader


def read_mapping_file(path: str | Path, what: str) -> dict:
    """The mapping in a YAML file (JSON for ``.json``); ``{}`` for an empty file.

    Args:
        what: what the mapping holds, for the messages ("limit names to values").

    Raises:
        FileNotFoundError: no such file.
        ValueError: a folder, a file that is not text, not valid YAML/JSON or not a mapping, or a key given
            twice; the message names the file.
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
            data = json.loads(text, object_pairs_hook=_json_pairs)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON (line {e.lineno}: {e.msg}); {must}") from None
        except _DuplicateKey as e:
            raise ValueError(f"{path}: the key {e} is given twice; give each once") from None
    else:
        import yaml

        try:
            data = yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - a SafeLoader subclass
        except _DuplicateKey as e:
            raise ValueError(f"{path}: the key {e} is given twice; give each once") from None
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
