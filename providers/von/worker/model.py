"""Von's checkpoint and forward pass (von.md §1, §3): ModernBERT plus the option-marker scorer.

`option_marker.pt` holds the full state dict (`model.safetensors`, the same encoder, is not
read). Each row of a pass keeps its own masks and position ids, so its logits do not depend on
what it is batched with.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from cachetools import LRUCache
from torch import nn

from decidealot.providers.json_files import read_json_object
from decidealot.providers.von.calibration import CalibrationError, parse
from decidealot.providers.worker import compiled, int8, modernbert
from decidealot.providers.worker.tokenizer import FastTokenizer, TokenizerError

WINDOW = 8192
"""Upstream forces `max_position_embeddings` to this; the state cut fits rows to it (a cut
row may still end a few tokens past it, as upstream's does: RoPE has no position table)."""

CPU_PASS_TOKENS = 1024
"""Padded tokens per forward pass on CPU: a row of a few hundred tokens already keeps the matrix
units busy, while a large pass spends its time on padding, [B, L, L] masks and activations out
of cache (bench/von.py: 2-3x slower per row). Elsewhere the token budget sizes a pass."""

SHARED_CACHE_ROWS = 4096
"""State-free rows (zero-shot nouls' debias rows) whose logits are kept for requests asking again;
each is scored in a pass of its own, as upstream's, so the same whichever request scored it."""


class VonCheckpointError(ValueError):
    """A Von checkpoint directory that cannot be served as it is."""


class OptionMarkerScorer(nn.Module):
    """Marker hidden state -> one logit; parameter names match upstream's `scorer.*` keys."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.input_norm = nn.LayerNorm(hidden_size)
        self.dense = nn.Linear(hidden_size, hidden_size // 2)
        self.norm = nn.LayerNorm(hidden_size // 2)
        self.out_proj = nn.Linear(hidden_size // 2, 1)

    def forward(self, markers: torch.Tensor) -> torch.Tensor:
        hidden = self.norm(nn.functional.gelu(self.dense(self.input_norm(markers))))
        return self.out_proj(hidden).squeeze(-1)


@dataclass(frozen=True)
class VonRow:  # one packed sequence
    ids: list[int]
    markers: list[int]
    shared: bool = False  # no state: its logits may be cached and reused

    @property
    def tokens(self) -> int:
        return len(self.ids)


def _independent_layout(row: VonRow, length: int) -> tuple[list[int], list[int]]:
    """Option span of every token (-1 outside options) and position ids restarting per option;
    the trailing `[SEP]` belongs to no option and keeps its raw position, as upstream's does."""
    spans = [-1] * length
    positions = list(range(length))
    last = len(row.ids) - 1
    prefix = row.markers[0]
    for k, start in enumerate(row.markers):
        end = row.markers[k + 1] if k + 1 < len(row.markers) else last
        for offset, t in enumerate(range(start, end)):
            spans[t] = k
            positions[t] = prefix + offset
    return spans, positions


class VonModel:
    def __init__(
        self,
        directory: str | Path,
        device: torch.device,
        precision: str = "fp32",
        calibration: str | Path | None = None,
    ):
        """`calibration` replaces the checkpoint's own file whole (upstream's `VON_CALIBRATION`)."""
        directory = Path(directory)
        # Upstream falls back to plain attention where the file is missing or unreadable, which
        # answers 1.2+ weights in the wrong mode: here that checkpoint is refused.
        path = Path(calibration or directory / "marker_calibration.json")
        data = read_json_object(
            path, lambda message: VonCheckpointError(f"Von checkpoint: {message}")
        )
        try:
            self.calibration = parse(data)
        except CalibrationError as exc:
            raise VonCheckpointError(f"Von checkpoint: {path.name}: {exc}") from None
        try:
            config = modernbert.Config.read(directory / "config.json")
        except modernbert.ModernBertConfigError as exc:
            raise VonCheckpointError(f"Von checkpoint: config.json: {exc}") from None
        try:
            self.tokenizer = FastTokenizer(directory, required=("mask_token", "sep_token"))
        except TokenizerError as exc:
            raise VonCheckpointError(f"Von checkpoint: {exc}") from None
        self.mask_id: int = self.tokenizer.mask_token_id  # type: ignore[assignment]
        self.pad_id: int = self.tokenizer.pad_token_id or 0  # padded keys are masked anyway
        with torch.device("meta"):  # shapes only: the checkpoint's tensors become the parameters
            self.encoder = modernbert.ModernBert(config)
            self.scorer = OptionMarkerScorer(config.hidden_size)
        self._load_weights(directory / "option_marker.pt")
        self.half_window: int = config.sliding_window
        self.device = device
        self._shared_logits: LRUCache[tuple[int, ...], torch.Tensor] = LRUCache(SHARED_CACHE_ROWS)
        self._shared_lock = threading.Lock()  # several passes may run at once
        self.encoder.to(device).eval()
        self.scorer.to(device).eval()
        self.amp_dtype, self.linears, self.lowered = modernbert.at_precision(
            self.encoder, precision, device, self._probe()
        )
        self.passes = compiled.Passes(self.encoder)

    def warm_up_rows(self) -> list[list[VonRow]]:
        """The compile's warm-up passes: the probe's ids, a `[MASK]` at each marker."""
        passes = []
        length = int8.PROBE_LENGTH
        for pass_rows in modernbert.warm_up_rows(self.encoder.config, length):
            rows = []
            for ids, markers in pass_rows:
                ids = [self.pad_id if i == self.mask_id else i for i in ids]
                for position in markers:
                    ids[position] = self.mask_id
                rows.append(VonRow(ids, markers))
            passes.append(rows)
        return passes

    def option_logits(
        self, rows: Sequence[VonRow], module: Callable[..., Any]
    ) -> list[list[float]]:
        with torch.inference_mode():
            return [logits.tolist() for logits in self._pass(rows, module)]

    def _probe(self) -> Callable[[], torch.Tensor]:
        """What `at_precision` checks int8 or bf16 against fp32 on: random rows' probabilities."""
        ids, markers = modernbert.probe_rows(self.encoder.config)
        ids[ids == self.mask_id] = self.pad_id
        ids[:, markers] = self.mask_id
        valid = torch.ones_like(ids)

        def probe() -> torch.Tensor:
            states = self.encoder(input_ids=ids, attention_mask=valid).last_hidden_state
            return self.scorer(states[:, markers].float()).softmax(-1)

        return probe

    def _load_weights(self, path: Path) -> None:
        weights = torch.load(path, map_location="cpu", weights_only=True)
        parts: dict[str, dict[str, torch.Tensor]] = {"encoder": {}, "scorer": {}}
        for key, tensor in weights.items():
            prefix, _, name = key.partition(".")
            if prefix not in parts:
                raise VonCheckpointError(f"Von checkpoint: unexpected weight {key!r}")
            parts[prefix][name] = tensor
        modernbert.load(self.encoder, parts["encoder"])
        modernbert.load(self.scorer, parts["scorer"])

    def logits(self, rows: Sequence[VonRow]) -> list[torch.Tensor]:
        """One logit vector per row: shared rows from the cache or a pass of their own."""
        own = [index for index, row in enumerate(rows) if not row.shared]
        scored = dict(zip(own, self._pass([rows[i] for i in own]), strict=True)) if own else {}
        return [scored[i] if i in scored else self._shared(row) for i, row in enumerate(rows)]

    def _shared(self, row: VonRow) -> torch.Tensor:
        key = tuple(row.ids)
        with self._shared_lock:
            cached = self._shared_logits.get(key)  # a hit is the most recently used now
        if cached is not None:
            return cached
        (logits,) = self._pass([row])
        with self._shared_lock:
            self._shared_logits[key] = logits.clone()  # the least recently used goes when full
        return logits

    def _pass(
        self, rows: Sequence[VonRow], encoder: Callable[..., Any] | None = None
    ) -> list[torch.Tensor]:
        """`encoder`: the encoder or its compiled form (None: what `passes` runs now)."""
        encoder = self.passes if encoder is None else encoder
        lengths = [len(row.ids) for row in rows]
        length = max(lengths)
        ids = torch.tensor([[*row.ids, *[self.pad_id] * (length - len(row.ids))] for row in rows])
        valid = torch.arange(length)[None, :] < torch.tensor(lengths)[:, None]
        ids, valid = ids.to(self.device), valid.to(self.device)
        with modernbert.autocast(self.device, self.amp_dtype):
            if self.calibration.independent_options:
                masks, positions = self._independent_masks(rows, length, valid)
                hidden = encoder(input_ids=ids, attention_mask=masks, position_ids=positions)
            else:
                hidden = encoder(input_ids=ids, attention_mask=valid.long())
        states = hidden.last_hidden_state.float()
        markers = torch.cat([states[b, row.markers] for b, row in enumerate(rows)])
        return list(self.scorer(markers).split([len(row.markers) for row in rows]))

    def _independent_masks(
        self, rows: Sequence[VonRow], length: int, valid: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Each option sees the prefix and itself only, at positions restarting after the
        prefix; sliding layers window on those reset positions, not on raw indices."""
        layouts = [_independent_layout(row, length) for row in rows]
        spans = torch.tensor([s for s, _ in layouts], dtype=torch.long, device=self.device)
        positions = torch.tensor([p for _, p in layouts], dtype=torch.long, device=self.device)
        query, key = spans.unsqueeze(2), spans.unsqueeze(1)
        outside = key == -1
        allowed = torch.where(query == -1, outside, outside | (key == query))
        allowed &= valid.unsqueeze(1)
        eye = torch.eye(length, dtype=torch.bool, device=self.device).unsqueeze(0)
        full = allowed | eye
        # rows x L x L in place and in int32: half the time of the int64 temporaries
        near = positions.to(torch.int32)
        distance = (near.unsqueeze(2) - near.unsqueeze(1)).abs_()
        sliding = (distance <= self.half_window).logical_and_(allowed).logical_or_(eye)
        return {
            modernbert.FULL: full.unsqueeze(1),
            modernbert.SLIDING: sliding.unsqueeze(1),
        }, positions
