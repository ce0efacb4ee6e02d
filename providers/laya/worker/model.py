"""The Laya network (laya.md §2, §4): ModernBERT encoder + typed decision head + scorer.

Parameter names match upstream's `model.safetensors`, so the checkpoint loads strictly; the head
is our own pre-LN transformer layer, numerically upstream's `nn.TransformerEncoderLayer`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError, safe_open
from torch import nn

from decidealot.providers.json_files import read_json_object
from decidealot.providers.laya import calibration as calibration_file
from decidealot.providers.laya.worker.render import Budget, LayaRow, Specials
from decidealot.providers.worker import compiled, modernbert
from decidealot.providers.worker.bf16 import Lowered
from decidealot.providers.worker.int8 import PROBE_LENGTH, Quantised
from decidealot.providers.worker.memory import drop_pages
from decidealot.providers.worker.tokenizer import CachedIds, FastTokenizer

LAYER_NORM_EPS = 1e-5
MASKED_LOGIT = -1e4


class HeadAttention(nn.Module):
    """Packed-projection self-attention with `nn.MultiheadAttention`'s parameter names. Under
    bf16 its projections are bf16 (`bf16.PACKED`) and its input is cast to match."""

    bf16_parameters = ("in_proj_weight", "in_proj_bias")

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * d, d))
        self.in_proj_bias = nn.Parameter(torch.empty(3 * d))
        self.out_proj = nn.Linear(d, d)

    def forward(
        self, x: torch.Tensor, keep: torch.Tensor, queries: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Attention over all of `x`; outputs only at `queries` (`[rows, K, d]`) when given."""
        x = x.to(self.in_proj_weight.dtype)
        if queries is None:
            projected = F.linear(x, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
        else:
            d = x.size(-1)
            q = F.linear(queries.to(x.dtype), self.in_proj_weight[:d], self.in_proj_bias[:d])
            kv = F.linear(x, self.in_proj_weight[d:], self.in_proj_bias[d:]).chunk(2, dim=-1)
            projected = (q, *kv)
        q, k, v = (part.unflatten(-1, (self.heads, -1)).transpose(1, 2) for part in projected)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        return self.out_proj(attended.transpose(1, 2).flatten(-2))


class HeadLayer(nn.Module):
    """Pre-LN encoder layer (ReLU feed-forward of width 4d), as upstream trains it."""

    def __init__(self, d: int):
        super().__init__()
        self.self_attn = HeadAttention(d, max(1, d // 64))
        self.linear1 = nn.Linear(d, 4 * d)
        self.linear2 = nn.Linear(4 * d, d)
        self.norm1 = nn.LayerNorm(d, eps=LAYER_NORM_EPS)
        self.norm2 = nn.LayerNorm(d, eps=LAYER_NORM_EPS)

    def forward(
        self, h: torch.Tensor, keep: torch.Tensor, index: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Every position's output, or only `index`'s (`[rows, K, d]`): a position sees the others
        only through attention's keys and values, so a subset is exact and skips most work."""
        y = self.norm1(h)
        if index is None:
            h = h + self.self_attn(y, keep)
        else:
            h = torch.gather(h, 1, index) + self.self_attn(y, keep, torch.gather(y, 1, index))
        return h + self.linear2(F.relu(self.linear1(self.norm2(h))))


class DecisionModel(nn.Module):
    """Encoder + head + scorer. `act_head` and `temperature` are loaded (strict load) but unused:
    the contract reports neither the act probability nor the training-time temperature buffer."""

    def __init__(self, encoder: nn.Module, head_layers: int, n_act: int):
        super().__init__()
        d = encoder.config.hidden_size
        self.encoder = encoder
        self.head = None  # `head.layers.<j>` (upstream's names), when there is a head
        if head_layers > 0:
            self.head = nn.ModuleDict(
                {"layers": nn.ModuleList(HeadLayer(d) for _ in range(head_layers))}
            )
        self.type_emb = modernbert.embedding(3, d)
        self.scorer = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d), nn.GELU(), nn.Linear(d, 1))
        self.act_head = nn.Sequential(nn.Linear(d + 4, 256), nn.GELU(), nn.Linear(256, n_act))
        self.register_buffer("temperature", torch.ones(3))

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        marker_pos: torch.Tensor,
        marker_mask: torch.Tensor,
        qtype: torch.Tensor,
    ) -> torch.Tensor:
        """Option logits `[rows, K]` in fp32; padded marker slots hold -1e4."""
        h = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        h = h + self.type_emb(qtype)[:, None, :]
        index = marker_pos[:, :, None].expand(-1, -1, h.size(-1))
        if self.head is None:
            markers = torch.gather(h, 1, index)
        else:
            keep = attention_mask.bool()[:, None, None, :]
            *inner, last = self.head.layers
            for layer in inner:
                h = layer(h, keep)
            markers = last(h, keep, index)  # only the markers are read out
        logits = self.scorer(markers).squeeze(-1).float()
        return logits.masked_fill(~marker_mask, MASKED_LOGIT)


@dataclass(frozen=True, eq=False)
class Checkpoint:
    """A loaded checkpoint; equal only to itself, as the group of its jobs' rows must be."""

    model: DecisionModel
    tokenizer: FastTokenizer
    specials: Specials
    budget: Budget
    temperatures: calibration_file.Temperatures
    device: torch.device
    pad_id: int
    texts: CachedIds  # the questions' texts' token ids, kept across requests
    amp_dtype: torch.dtype  # this and the next two: `modernbert.at_precision`'s
    linears: Quantised
    lowered: Lowered | None
    passes: compiled.Passes  # the model, or its compiled pass once checked

    def forward(self, rows: Sequence[LayaRow]) -> list[list[float]]:
        return self.option_logits(rows, self.passes)

    def warm_up_rows(self) -> list[list[LayaRow]]:
        """The compile's warm-up passes, as the renderer lays rows out (`[CLS]` first)."""
        length = min(self.budget.max_len, PROBE_LENGTH)
        passes = []
        for pass_rows in modernbert.warm_up_rows(self.model.encoder.config, length):
            rows = []
            for i, (ids, markers) in enumerate(pass_rows):
                ids[0] = self.specials.cls_id
                for position in markers:
                    ids[position] = self.specials.mask_id
                rows.append(LayaRow(ids, markers, i % 3, len(ids), len(ids)))
            passes.append(rows)
        return passes

    def option_logits(
        self, rows: Sequence[LayaRow], module: Callable[..., torch.Tensor]
    ) -> list[list[float]]:
        """Each row's option logits, from one pass through `module` (the model, or its compiled
        form) padded on the right; each input is one tensor made from lists (a tensor per row,
        copied in, cost more)."""
        lengths = [len(row.ids) for row in rows]
        counts = [len(row.markers) for row in rows]
        length, width = max(lengths), max(counts)
        ids = [[*row.ids, *[self.pad_id] * (length - len(row.ids))] for row in rows]
        markers = [[*row.markers, *[0] * (width - len(row.markers))] for row in rows]
        inputs = {
            "input_ids": torch.tensor(ids),
            "attention_mask": torch.tensor([[1] * n + [0] * (length - n) for n in lengths]),
            "marker_pos": torch.tensor(markers),
            "marker_mask": torch.arange(width)[None, :] < torch.tensor(counts)[:, None],
            "qtype": torch.tensor([row.qtype for row in rows], dtype=torch.long),
        }
        with torch.inference_mode(), modernbert.autocast(self.device, self.amp_dtype):
            logits = module(**{name: t.to(self.device) for name, t in inputs.items()})
        values = logits.cpu().tolist()
        return [values[i][: len(row.markers)] for i, row in enumerate(rows)]


def probe(model: DecisionModel, specials: Specials, budget: Budget) -> Callable[[], torch.Tensor]:
    """What `at_precision` checks int8 or bf16 against fp32 on: random rows' probabilities."""
    ids, markers = modernbert.probe_rows(model.encoder.config, min(budget.max_len, PROBE_LENGTH))
    marker_pos = markers.expand(len(ids), -1).contiguous()
    ids.scatter_(1, marker_pos, specials.mask_id)
    ids[:, 0] = specials.cls_id
    inputs = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "marker_pos": marker_pos,
        "marker_mask": torch.ones_like(marker_pos, dtype=torch.bool),
        "qtype": torch.arange(len(ids)) % 3,
    }
    return lambda: model(**inputs).softmax(-1)


class WeightsError(ValueError):
    """A weights file that is not a well-formed safetensors file."""


def read_safetensors(path: Path, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Every tensor in `path`, floating-point ones as `dtype` (None: as stored), each copied from
    the file's mapping, whose pages are then given back: one copy, the model plus one tensor at
    the peak (`safetensors.torch.load_file` and `.float()` held two; docs/performance.md)."""
    try:
        with safe_open(path, framework="pt") as file:
            names = file.keys()  # the handle is not iterable
            return {name: _own_copy(file.get_tensor(name), dtype) for name in names}
    except SafetensorError as exc:
        raise WeightsError(f"{path.name} is not a well-formed safetensors file ({exc})") from exc


def _own_copy(view: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    target = dtype if dtype is not None and view.is_floating_point() else view.dtype
    out = view.to(target, copy=True)  # its own memory, never a view of the mapping
    if size := view.numel() * view.element_size():
        drop_pages(view.data_ptr(), size)  # the page cache keeps them
    return out


def _require(path: Path, what: str) -> Path:
    if not path.exists():
        raise FileNotFoundError(f"Laya checkpoint is missing {what} ({path.name})")
    return path


def load_checkpoint(
    directory: str | Path,
    device: torch.device,
    precision: str = "fp32",
    calibration: str | Path | None = None,
) -> Checkpoint:
    """The checkpoint in `directory`, its fp16 weights read as fp32, in `precision` (resolved)."""
    root = Path(directory)
    config = read_json_object(_require(root / "rl_agent_config.json", "its config"), ValueError)
    weights_path = _require(root / "model.safetensors", "its weights")
    encoder_dir = _require(root / "encoder", "its encoder config")
    tokenizer = FastTokenizer(
        _require(root / "tokenizer", "its tokenizer"),
        required=("cls_token", "sep_token", "mask_token", "pad_token"),  # laya.md §1.4
    )
    if "head_layers" not in config or "encoder" not in config:
        raise ValueError("rl_agent_config.json: 'encoder' and 'head_layers' are required")
    if config.get("option_layout", "sequential") != "sequential":
        raise ValueError("rl_agent_config.json: only the sequential option layout is supported")
    temperatures = calibration_file.Temperatures(
        config.get("temperature", [1.0, 1.0, 1.0]), config.get("temperature_by_options", {})
    )
    if calibration is not None:
        payload = calibration_file.read_calibration(Path(calibration))
        temperatures = calibration_file.Temperatures.of(payload)

    encoder_config = modernbert.Config.read(
        _require(encoder_dir / "config.json", "its encoder config")
    )
    with torch.device("meta"):  # shapes only: the checkpoint's tensors become the parameters
        model = DecisionModel(
            modernbert.ModernBert(encoder_config),
            int(config["head_layers"]),
            len(config.get("act_costs", {})) + 1,
        )
    modernbert.load(model, read_safetensors(weights_path, torch.float32))
    model.to(device).eval().requires_grad_(False)
    specials = Specials(
        cls_id=tokenizer.cls_token_id,
        sep_id=tokenizer.sep_token_id,
        mask_id=tokenizer.mask_token_id,
        mask_text=tokenizer.mask_token,
    )
    budget = Budget(int(config.get("max_len", 512)), int(config.get("head_max_len", 192)))
    head = () if model.head is None else (model.head,)  # bf16 lowers its projections too
    chosen = modernbert.at_precision(
        model.encoder, precision, device, probe(model, specials, budget), head
    )
    pad_id, texts = tokenizer.pad_token_id, CachedIds(tokenizer)
    return Checkpoint(
        model,
        tokenizer,
        specials,
        budget,
        temperatures,
        device,
        pad_id,
        texts,
        *chosen,
        compiled.Passes(model),
    )
