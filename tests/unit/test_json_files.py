"""The shared reader of a provider's JSON objects: Python's `json` semantics (a NaN literal loads,
as the upstream packages load it), and for each way a file can be unusable one message that
names the file, raised as the caller's own error."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from decidealot.providers.json_files import read_json_object


class Refused(ValueError):
    """The caller's error type: the reader must raise this one, not its own."""


def test_an_object_loads_with_nan_and_infinity_literals(tmp_path: Path) -> None:
    path = tmp_path / "calibration.json"
    path.write_text('{"temperature": [NaN, Infinity, 1.5], "nested": {"a": null}}')
    data = read_json_object(path, Refused)
    assert math.isnan(data["temperature"][0]) and data["temperature"][1] == math.inf
    assert data["nested"] == {"a": None}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"a": "caf\xe9"}', "calibration.json is not UTF-8 JSON (invalid continuation byte"),
        (b'{"a": 1,}', "calibration.json is not valid JSON (Expecting property name"),
        (b"", "calibration.json is not valid JSON (Expecting value: line 1 column 1"),
        (b"[1, 2]", "calibration.json is not a JSON object but an array"),
        (b'"text"', "calibration.json is not a JSON object but a string"),
        (b"2.5", "calibration.json is not a JSON object but a number"),
        (b"true", "calibration.json is not a JSON object but a boolean"),
        (b"null", "calibration.json is not a JSON object but null"),
    ],
)
def test_an_unusable_file_is_refused_naming_it(
    tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "calibration.json"
    path.write_bytes(content)
    with pytest.raises(Refused) as caught:
        read_json_object(path, Refused)
    assert str(caught.value).startswith(message)


def test_a_missing_or_unreadable_file_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(
        Refused, match=r"^absent\.json cannot be read \(No such file or directory\)$"
    ):
        read_json_object(tmp_path / "absent.json", Refused)
    (tmp_path / "folder.json").mkdir()
    with pytest.raises(Refused, match=r"^folder\.json cannot be read \(Is a directory\)$"):
        read_json_object(tmp_path / "folder.json", Refused)


def test_the_callers_callable_shapes_the_error(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("[]")
    with pytest.raises(Refused, match=r"^Von checkpoint: config\.json is not a JSON object"):
        read_json_object(path, lambda message: Refused(f"Von checkpoint: {message}"))
