"""`Decidealot-Truncated`: an RFC 8941 List of sf-strings with integer parameters, written by
the HTTP API and read back by `decidealot mcp --url`."""

from __future__ import annotations

import pytest

from decidealot.contract import Cut, read_truncated_header, truncated_header


def test_members_are_sf_strings_with_read_total_and_item() -> None:
    cuts = [Cut("category", 452, 1911), Cut("urgency", 463, 1911, item=3)]
    header = truncated_header(cuts)
    assert header == '"category";read=452;total=1911, "urgency";read=463;total=1911;item=3'
    assert read_truncated_header(header) == cuts


@pytest.mark.parametrize(
    ("name", "written"),
    [
        ('say "why"', r'"say \"why\""'),
        ("back\\slash", r'"back\\slash"'),
        ("100%", '"100%25"'),
        ("priorité", '"priorit%C3%A9"'),
        ("tab\there", '"tab%09here"'),
        ("緊急", '"%E7%B7%8A%E6%80%A5"'),
    ],
)
def test_names_outside_printable_ascii_are_escaped_and_read_back(name: str, written: str) -> None:
    header = truncated_header([Cut(name, 1, 2)])
    assert header == f"{written};read=1;total=2"
    assert header.isascii() and header.isprintable()
    assert read_truncated_header(header) == [Cut(name, 1, 2)]


@pytest.mark.parametrize(
    "value",
    [
        "",
        "category",
        '"a";read=1',
        '"a";read=1;total=2,',
        '"a";read=x;total=2',
        '"%FF";read=1;total=2',
    ],
)
def test_anything_else_is_not_read(value: str) -> None:
    assert read_truncated_header(value) is None
