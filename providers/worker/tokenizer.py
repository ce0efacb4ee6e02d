"""A checkpoint's `tokenizer.json` through the `tokenizers` library alone, as transformers'
`PreTrainedTokenizerFast` encodes and decodes it (loading that imported most of transformers, a
second or more of a worker's start), with what transformers does that changes ids
(tests/worker/test_modernbert.py compares both).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from decidealot.providers.json_files import read_json_object

ROLES = ("cls_token", "sep_token", "pad_token", "mask_token", "unk_token", "bos_token", "eos_token")


class TokenizerError(ValueError):
    """A tokenizer folder that cannot be served as transformers would load it."""


def _content(value: object) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read(path: Path) -> dict[str, object]:
    return read_json_object(path, TokenizerError) if path.exists() else {}


class FastTokenizer:
    """A tokenizer folder, called as transformers' is (`{"input_ids": ...}`), with each special
    token of `ROLES` and its id as attributes (`mask_token`, `mask_token_id`; None if unnamed)."""

    mask_token: str
    sep_token: str
    cls_token_id: int
    sep_token_id: int
    mask_token_id: int
    pad_token_id: int | None

    def __init__(self, directory: Path, *, required: Sequence[str] = ()) -> None:
        try:
            self._tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        except Exception as exc:  # tokenizers raises its own Exception subclass
            raise TokenizerError("cannot load tokenizer.json") from exc
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        config = _read(directory / "tokenizer_config.json")
        # transformers reads special_tokens_map.json only for configs without
        # added_tokens_decoder, and then its entries win.
        legacy = (
            {} if "added_tokens_decoder" in config else _read(directory / "special_tokens_map.json")
        )
        self._clean_up = bool(config.get("clean_up_tokenization_spaces", False)) and (
            type(self._tokenizer.model).__name__ != "BPE"
        )
        for role in ROLES:
            token = _content(legacy.get(role)) or _content(config.get(role))
            token_id = None if token is None else self._tokenizer.token_to_id(token)
            if token is not None and token_id is None:
                raise TokenizerError(f"the tokenizer's {role} {token!r} is not in its vocabulary")
            if token is None and role in required:
                raise TokenizerError(f"the tokenizer names no {role}")
            setattr(self, role, token)
            setattr(self, f"{role}_id", token_id)

    def __call__(self, text: str | list[str], add_special_tokens: bool = True) -> dict[str, Any]:
        if isinstance(text, str):
            return {
                "input_ids": self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
            }
        # `encode_batch_fast` is `encode_batch` without the character offsets (ids only)
        encoded = self._tokenizer.encode_batch_fast(text, add_special_tokens=add_special_tokens)
        return {"input_ids": [each.ids for each in encoded]}

    def decode(self, ids: list[int]) -> str:
        text = self._tokenizer.decode(ids, skip_special_tokens=False)
        if self._clean_up:  # transformers' clean_up_tokenization (it skips BPE models)
            for spaced in _CLEAN_UP:
                text = text.replace(spaced, spaced.strip())
        return text


class CachedIds:
    """Token ids of texts that recur across requests (a three-question request's dozen texts
    cost three times its state to tokenise), at most `size` (emptied when full)."""

    def __init__(self, tokenizer: FastTokenizer, size: int = 4096) -> None:
        self._tokenizer = tokenizer
        self._size = size
        self._ids: dict[str, list[int]] = {}

    def __call__(self, texts: Sequence[str]) -> list[list[int]]:
        known = self._ids
        found = {text: known.get(text) for text in texts}
        missing = [text for text, ids in found.items() if ids is None]
        if missing:
            encoded = self._tokenizer(missing, add_special_tokens=False)["input_ids"]
            if len(known) + len(missing) > self._size:
                known = self._ids = {}
            for text, ids in zip(missing, encoded, strict=True):
                found[text] = known[text] = ids
        return [found[text] for text in texts]  # type: ignore[misc]


_CLEAN_UP = (" .", " ?", " !", " ,", " ' ", " n't", " 'm", " 's", " 've", " 're")
"""What transformers' `clean_up_tokenization` joins to the word before, in its order."""
