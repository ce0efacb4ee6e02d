"""The worker's own ModernBERT, tokenizer and weight reader against transformers and safetensors.

The engines run `decidealot.providers.worker.modernbert` and `.tokenizer` so that a worker never
imports transformers (its import cost more than torch's). These tests pin that they compute
what transformers' `ModernBertModel` (sdpa) and `PreTrainedTokenizerFast` compute, on the tiny
checkpoints' configs and tokenizers, and that the engines' processes import no transformers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoTokenizer, ModernBertModel

from decidealot.providers.laya.worker.model import WeightsError, read_safetensors
from decidealot.providers.worker import modernbert
from decidealot.providers.worker.tokenizer import CachedIds, FastTokenizer, TokenizerError
from tests.support.checkpoints import TinyCheckpoints

TEXTS = [
    "Ticket 42: the customer was charged twice and asks for a refund.",
    "  leading and trailing spaces  ",
    "Zahlung für Bestellung 84213 fehlgeschlagen — bitte prüfen. 日本語のテキスト",
    "a [MASK] literal, a [SEP] and [CLS] inside user text",
    "",
    "digits 2026-09-22 and 3.14159",
]


@pytest.fixture(scope="module")
def folders(tiny: TinyCheckpoints) -> dict[str, tuple[Path, Path]]:
    """(encoder config folder, tokenizer folder) of every tiny checkpoint kind: Laya's two
    tokenizer and RoPE variants, and Von's."""
    laya, von = tiny.laya_all(), tiny.von(independent_options=True)
    return {
        "laya-english": (laya["english"] / "encoder", laya["english"] / "tokenizer"),
        "laya-multilingual": (laya["multilingual"] / "encoder", laya["multilingual"] / "tokenizer"),
        "von": (von, von),
    }


@pytest.fixture(scope="module")
def encoders(folders: dict[str, tuple[Path, Path]]) -> dict[str, Path]:
    return {name: encoder for name, (encoder, _) in folders.items()}


@pytest.fixture(scope="module")
def tokenizers(folders: dict[str, tuple[Path, Path]]) -> dict[str, Path]:
    return {name: tokenizer for name, (_, tokenizer) in folders.items()}


def meta_encoder(config: modernbert.Config) -> modernbert.ModernBert:
    """The encoder on the meta device, as the Laya and Von models build it: nothing allocated."""
    with torch.device("meta"):
        return modernbert.ModernBert(config)


def pair(directory: Path, seed: int = 0) -> tuple[ModernBertModel, modernbert.ModernBert]:
    """transformers' encoder with random weights, and ours holding the same tensors."""
    torch.manual_seed(seed)
    theirs = ModernBertModel(AutoConfig.from_pretrained(str(directory), attn_implementation="sdpa"))
    ours = meta_encoder(modernbert.Config.read(directory / "config.json"))
    modernbert.load(ours, {k: v.clone() for k, v in theirs.state_dict().items()})
    return theirs.eval(), ours.eval()


@pytest.mark.parametrize("name", ["laya-english", "laya-multilingual", "von"])
@pytest.mark.parametrize("length", [5, 40, 90])
def test_hidden_states_equal_transformers_bit_for_bit(
    encoders: dict[str, Path], name: str, length: int
) -> None:
    """Rows shorter and longer than the sliding window, padded and not."""
    theirs, ours = pair(encoders[name])
    vocab = ours.config.vocab_size
    ids = torch.randint(0, vocab, (3, length), generator=torch.Generator().manual_seed(length))
    padded = torch.ones(3, length, dtype=torch.long)
    padded[1, length // 2 :] = 0
    padded[2, -1:] = 0
    for mask in (padded, torch.ones_like(padded)):
        with torch.inference_mode():
            expected = theirs(input_ids=ids, attention_mask=mask).last_hidden_state
            got = ours(input_ids=ids, attention_mask=mask).last_hidden_state
        assert torch.equal(got, expected)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_per_layer_masks_and_position_ids_equal_transformers(
    encoders: dict[str, Path], attention: str
) -> None:
    """Von's independent-options pass hands the encoder its own additive 4-D masks per layer
    type and position ids that restart per option; transformers reads them alike under sdpa and
    eager attention."""
    theirs, ours = pair(encoders["von"], seed=3)
    theirs.set_attn_implementation(attention)
    length = 30
    ids = torch.randint(0, ours.config.vocab_size, (2, length))
    spans = torch.tensor([[-1] * 10 + [0] * 10 + [1] * 10, [-1] * 12 + [0] * 9 + [1] * 9])
    positions = torch.where(spans < 0, torch.arange(length), 10 + torch.arange(length) % 10)
    allowed = (spans[:, :, None] == spans[:, None, :]) | (spans[:, None, :] == -1)
    near = (positions[:, :, None] - positions[:, None, :]).abs() <= ours.config.sliding_window
    blocked = torch.finfo(torch.float32).min
    masks = {
        modernbert.FULL: torch.zeros(2, 1, length, length).masked_fill(~allowed[:, None], blocked),
        modernbert.SLIDING: torch.zeros(2, 1, length, length).masked_fill(
            ~(allowed & near)[:, None], blocked
        ),
    }
    with torch.inference_mode():
        expected = theirs(input_ids=ids, attention_mask=masks, position_ids=positions)
        got = ours(input_ids=ids, attention_mask=masks, position_ids=positions)
    assert torch.allclose(got.last_hidden_state, expected.last_hidden_state, atol=1e-5)


def test_transformers_4_rope_keys_and_defaults_read_as_transformers_reads_them(
    tmp_path: Path,
) -> None:
    raw = {"model_type": "modernbert", "hidden_size": 32, "num_attention_heads": 2}
    for extra in ({"global_rope_theta": 80000.0, "local_rope_theta": 5000.0}, {}):
        folder = tmp_path / f"cfg{len(extra)}"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(raw | extra))
        theirs = AutoConfig.from_pretrained(str(folder))
        ours = modernbert.Config.read(folder / "config.json")
        assert dict(ours.rope_theta) == {
            kind: theirs.rope_parameters[kind]["rope_theta"] for kind in dict(ours.rope_theta)
        }
        assert list(ours.layer_types) == theirs.layer_types
        assert ours.sliding_window == theirs.sliding_window


@pytest.mark.parametrize(
    "change",
    [
        {"model_type": "bert"},
        {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
        {"hidden_activation": "silu"},
        {"hidden_size": 33},
        {"layer_types": ["chunked_attention"]},
    ],
)
def test_configs_it_cannot_run_as_transformers_would_are_refused(
    tmp_path: Path, change: dict[str, object]
) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps(
            {"model_type": "modernbert", "hidden_size": 32, "num_attention_heads": 2} | change
        )
    )
    with pytest.raises(modernbert.ModernBertConfigError):
        modernbert.Config.read(tmp_path / "config.json")


def test_building_allocates_nothing_and_loading_assigns_without_copying(
    encoders: dict[str, Path],
) -> None:
    built = meta_encoder(modernbert.Config.read(encoders["von"] / "config.json"))
    assert {p.device.type for p in built.parameters()} == {"meta"}
    theirs, _ = pair(encoders["von"])
    state = {k: v.clone() for k, v in theirs.state_dict().items()}
    modernbert.load(built, state)
    assert all(p.data_ptr() == state[k].data_ptr() for k, p in built.named_parameters())
    with pytest.raises(RuntimeError):  # strict: a missing key is refused
        modernbert.load(meta_encoder(built.config), dict(list(state.items())[1:]))


@pytest.mark.parametrize("name", ["laya-english", "laya-multilingual", "von"])
def test_the_tokenizer_encodes_and_decodes_as_transformers(
    tokenizers: dict[str, Path], name: str
) -> None:
    theirs = AutoTokenizer.from_pretrained(str(tokenizers[name]))
    ours = FastTokenizer(tokenizers[name])
    for special in (True, False):
        assert (
            ours(TEXTS, add_special_tokens=special)["input_ids"]
            == theirs(TEXTS, add_special_tokens=special)["input_ids"]
        )
        for text in TEXTS:
            ids = ours(text, add_special_tokens=special)["input_ids"]
            assert ids == theirs(text, add_special_tokens=special)["input_ids"]
            assert ours.decode(ids) == theirs.decode(ids)
            assert ours.decode(ids[1:-1]) == theirs.decode(ids[1:-1])
    for role in ("mask", "sep", "cls", "pad"):
        assert getattr(ours, f"{role}_token_id") == getattr(theirs, f"{role}_token_id")
    assert (ours.mask_token, ours.sep_token) == (theirs.mask_token, theirs.sep_token)


def test_kept_ids_are_the_tokenizers_and_each_recurring_text_is_tokenised_once(
    tokenizers: dict[str, Path],
) -> None:
    tokenizer = FastTokenizer(tokenizers["laya-english"])
    asked: list[list[str]] = []

    class Counting(FastTokenizer):
        def __call__(self, text, add_special_tokens=True):  # type: ignore[no-untyped-def, override]
            asked.append(list(text))
            return tokenizer(text, add_special_tokens=add_special_tokens)

    kept = CachedIds(Counting.__new__(Counting), size=4)
    texts = ["billing: refunds", " level 0: routine", "billing: refunds"]
    expected = tokenizer(texts, add_special_tokens=False)["input_ids"]
    assert kept(texts) == expected and kept(texts) == expected
    assert asked == [["billing: refunds", " level 0: routine"]]  # once each, none again
    kept(["a", "b", "c"])  # past `size` texts: emptied, then these kept
    assert kept(texts) == expected and len(asked) == 3


def tokenizer_copy(tokenizers: dict[str, Path], folder: Path) -> dict[str, object]:
    """Von's tiny tokenizer.json in `folder`; its tokenizer_config.json's contents, to write."""
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes((tokenizers["von"] / "tokenizer.json").read_bytes())
    return json.loads((tokenizers["von"] / "tokenizer_config.json").read_text())


def test_special_tokens_come_from_the_legacy_map_as_transformers_reads_it(
    tokenizers: dict[str, Path], tmp_path: Path
) -> None:
    folder = tmp_path / "tok"
    config = tokenizer_copy(tokenizers, folder)
    config.pop("added_tokens_decoder", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config | {"pad_token": "[UNK]"}))
    (folder / "special_tokens_map.json").write_text(json.dumps({"pad_token": "[SEP]"}))
    theirs = AutoTokenizer.from_pretrained(str(folder))
    assert FastTokenizer(folder).pad_token_id == theirs.pad_token_id


def test_a_required_special_token_that_is_missing_is_refused(
    tokenizers: dict[str, Path], tmp_path: Path
) -> None:
    folder = tmp_path / "tok"
    config = tokenizer_copy(tokenizers, folder)
    (folder / "tokenizer_config.json").write_text(json.dumps(config | {"mask_token": None}))
    with pytest.raises(TokenizerError, match="mask_token"):
        FastTokenizer(folder, required=("mask_token",))
    (folder / "tokenizer_config.json").write_text(json.dumps(config | {"mask_token": "<nope>"}))
    with pytest.raises(TokenizerError, match="not in its vocabulary"):
        FastTokenizer(folder)


def test_safetensors_are_read_as_safetensors_reads_them(tmp_path: Path) -> None:
    tensors = {
        "half": torch.randn(7, 5).half(),
        "float": torch.randn(3),
        "ints": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "empty": torch.zeros(0, 4),
        "scalar": torch.tensor(2.5),
    }
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    expected = load_file(str(path))
    as_stored = read_safetensors(path)
    assert as_stored.keys() == expected.keys()
    for name, tensor in expected.items():
        assert as_stored[name].dtype == tensor.dtype and torch.equal(as_stored[name], tensor)
    as_float = read_safetensors(path, torch.float32)
    assert as_float["half"].dtype == torch.float32
    assert torch.equal(as_float["half"], expected["half"].float())
    assert as_float["ints"].dtype == torch.int64
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(WeightsError):
        read_safetensors(path)
    path.write_bytes(b"\x00\x01")
    with pytest.raises(WeightsError):
        read_safetensors(path)


def test_a_worker_running_laya_and_von_imports_no_transformers(tiny: TinyCheckpoints) -> None:
    """What a worker imports is what a model switch and a first decision pay for. It reads
    checkpoints through `safetensors.safe_open` (the package's Rust reader, 1 ms to import),
    never `safetensors.torch`'s loaders."""
    laya, von = tiny.laya_all()["english"], tiny.von(independent_options=False)
    script = (
        "import sys\n"
        "from decidealot.jobs import EngineSpec\n"
        "from decidealot.providers.engine.proc import build_engine\n"
        "from decidealot.providers.engine.protocol import ignore_load\n"
        f"build_engine(EngineSpec('decidealot.providers.laya.worker.engine:create', "
        f"{{'english': {str(laya)!r}}}, ['english']), ignore_load)\n"
        f"build_engine(EngineSpec('decidealot.providers.von.worker.engine:create', "
        f"{{'von-1.1': {str(von)!r}}}, ['von-1.1']), ignore_load)\n"
        "print(sorted(m for m in ('transformers', 'safetensors.torch', 'torch._dynamo', "
        "'huggingface_hub') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-P", "-c", script], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stderr[-2000:]
