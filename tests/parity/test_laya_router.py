"""Laya routing parity with upstream `laya.Router` / `laya.lang.analyse`, and gateway purity."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path
from typing import Any

import msgspec
import pytest

from decidealot import registry
from decidealot.contract import SystemOneRequest
from decidealot.jobs import Job
from decidealot.providers.gateway.checkpoint_provider import CheckpointProvider
from decidealot.providers.laya.descriptor import SELECTORS
from decidealot.providers.laya.gateway import lang
from decidealot.providers.laya.gateway.router import (
    AUTO_SELECTORS,
    TYPED_DECISION_WORKFLOWS,
    checkpoint_for,
    detect_checkpoint,
    named_checkpoint,
    workflow_of,
)
from decidealot.service import build_providers, lane_of

upstream_lang = pytest.importorskip("laya.lang")
upstream_router = pytest.importorskip("laya.router")

SAMPLES: list[Any] = [
    "I was charged twice for my order, please refund the duplicate payment.",
    "Why hasn't my card been delivered?",
    "Mein Konto wurde zweimal belastet, bitte helfen Sie mir.",
    "Je voudrais annuler ma commande, merci beaucoup pour votre aide.",
    "Quiero cancelar mi pedido porque no llegó a tiempo.",
    "Voce pode me mandar a nota fiscal?",
    "Deu erro 500 no endpoint de login depois do update",
    "Il pacco non è ancora arrivato e vorrei un rimborso.",
    "Het pakket is niet aangekomen en ik wil mijn geld terug.",
    "kan inte logga in",
    "Jag behöver hjälp med min faktura, den är fel.",
    "Vreau să anulez comanda pentru că nu a sosit.",
    "ami amar taka ferot chai, apnar service khub kharap",
    "Mən sifarişimi ləğv etmək istəyirəm, çox gecikdi.",
    "Zamówienie nie dotarło, proszę o zwrot pieniędzy.",
    "Objednávka nedorazila, prosím o vrácení peněz.",
    "Siparişim gelmedi, paramı geri istiyorum lütfen.",
    "Мой заказ не пришёл вовремя, верните деньги.",
    "我的订单没有到，请退款。",
    "注文が届きません。返金してください。",
    "주문이 도착하지 않았습니다. 환불해 주세요.",
    "طلبي لم يصل، أريد استرداد أموالي.",
    "मेरा ऑर्डर नहीं आया, कृपया रिफंड करें।",
    "ההזמנה שלי לא הגיעה, אני רוצה החזר.",
    "Η παραγγελία μου δεν έφτασε, θέλω επιστροφή χρημάτων.",
    "ฉันยังไม่ได้รับสินค้า กรุณาคืนเงิน",
    "என் ஆர்டர் வரவில்லை",
    "შეკვეთა არ მოსულა",
    "Set α to 0.05 and rerun the job.",
    "Дмитрий Петрович Савицкий signed the contract yesterday.",
    "MON DES EST LA",
    "STORES LOS ANGELES LAS VEGAS EL PASO CLOSED",
    "WIE SPÄT IST ES IN KÖLN",
    "sag mir das HEUTIGE DATUM",
    "Please review github.com/acme/os.path and user@acme.com v1.2.3",
    "12345 67890 !!! ???",
    "",
    "café résumé",
    {"subject": "Refund request", "body": "I was charged twice, please help me with this."},
    {
        "subject": "Refund request",
        "body": "Mein Konto wurde zweimal belastet, bitte helfen Sie mir.",
    },
    {
        "note": "The customer called about the invoice and the shipping delay. " * 20,
        "message": "Olá, ainda não recebi o meu pedido, podem verificar por favor?",
    },
    ["The customer wrote in.", "Je n'ai toujours pas reçu ma commande, que se passe-t-il ?"],
    "English intro line for the ticket.\nLa commande n'est pas arrivée et je veux être remboursé.",
    "Traceback: value = compute(x); print(y)\nThe job failed when it started.",
    {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": "Mein Konto wurde belastet"}}}}}}}},
    {"message": "Please check this order", "name": "José", "city": "São Paulo"},
    {"items": [1, 2.5, True, None], "text": "the order is late and we need it now"},
]

WORDS = {  # space-separated words per language or kind
    "en": "the customer is waiting for a refund because the order was late and we have",
    "de": "der die das und ist nicht mit für auf bitte heute Konto belastet",
    "fr": "le la les des une est pour dans avec merci commande annuler",
    "es": "el los las que por con para una pedido cancelar gracias",
    "pt": "os as que em um uma para com não você pedido",
    "ru": "мой заказ не пришёл верните деньги пожалуйста",
    "zh": "我的 订单 没有 到 请 退款",
    "hi": "मेरा ऑर्डर नहीं आया कृपया रिफंड",
    "ko": "주문이 도착하지 않았습니다 환불해 주세요",
    "pl": "zamówienie nie dotarło proszę o zwrot pieniędzy",
    "sv": "jag behöver hjälp med min faktura den är fel",
    "code": "x = f(y); {a: [1, 2]} API_KEY ID-42 v2.0 SKU",
}


def _mixed_state(rng: random.Random) -> Any:
    """Mostly English states with foreign, shouted, code or non-Latin lines and fields mixed in."""

    def text(pool: str, low: int = 1, high: int = 14) -> str:
        words = [rng.choice(WORDS[pool].split()) for _ in range(rng.randint(low, high))]
        if rng.random() < 0.1:
            words = [w.upper() for w in words]
        return " ".join(words)

    def leaf() -> str:
        lines = [text("en", 3, 30)]
        for _ in range(rng.randint(0, 2)):
            lines.insert(rng.randint(0, len(lines)), text(rng.choice(sorted(WORDS))))
        return "\n".join(lines) if rng.random() < 0.5 else " ".join(lines)

    shape = rng.random()
    if shape < 0.3:
        return leaf()
    if shape < 0.7:
        return {
            f"field{i}": leaf() if rng.random() < 0.7 else text(rng.choice(sorted(WORDS)))
            for i in range(rng.randint(1, 4))
        }
    return [leaf() for _ in range(rng.randint(1, 4))]


def _corpus() -> list[Any]:
    rng = random.Random("laya-router")
    return SAMPLES + [_mixed_state(rng) for _ in range(300)]


def _long_state(rng: random.Random) -> Any:
    """Past upstream's 4000-character windows: long English lines and fields, with a foreign
    line or field (or none) before, across or after the window, in strings and structures."""

    def line(pool: str) -> str:
        return " ".join(rng.choice(WORDS[pool].split()) for _ in range(rng.randint(4, 40)))

    english = [line("en") for _ in range(rng.randint(60, 400))]
    foreign = line(rng.choice([k for k in sorted(WORDS) if k != "en"]))
    if rng.random() < 0.8:
        english.insert(rng.randint(0, len(english)), foreign)
    if rng.random() < 0.2:
        english.append(foreign * rng.randint(100, 300))  # one line longer than the window
    shape = rng.random()
    if shape < 0.3:
        return "\n".join(english)
    if shape < 0.7:
        cut = rng.randint(1, len(english))
        return {"note": "\n".join(english[:cut]), "message": "\n".join(english[cut:])}
    return [" ".join(english[i : i + 20]) for i in range(0, len(english), 20)]


def test_long_states_read_what_upstream_reads(upstream: Any) -> None:
    """Upstream reads the whole state's first 4000 characters, its lines up to 4000 characters
    in all (the segment scan), then every line of every string value, each cut at 4000: a
    foreign field far past the window still leaves the English checkpoint."""
    rng = random.Random("laya-long")
    routed = set()
    for _ in range(60):
        state = _long_state(rng)
        assert len(msgspec.json.encode(state)) > 4000
        assert _ours(state) == _theirs(state)
        expected = upstream.route(state, {"q": {"type": "noul"}})["model"]
        assert route("laya", state, ["q"]) == expected
        routed.add(expected)
    assert routed == {"english", "multilingual"}


@pytest.fixture(scope="module")
def upstream() -> Any:
    return upstream_router.Router(auto_task_detection=True)


DETECTED = ("script", "is_english", "language_undecided")
"""What routing reads of a detection: `lang.Detection`'s fields, upstream's keys."""


def _ours(state: Any) -> dict[str, object]:
    detection = lang.analyse(state)
    return {key: getattr(detection, key) for key in DETECTED}


def _theirs(state: Any) -> dict[str, object]:
    detection = upstream_lang.analyse(state)
    return {key: detection[key] for key in DETECTED}


def test_detection_matches_upstream_analyse() -> None:
    for state in _corpus():
        assert _ours(state) == _theirs(state), state


def test_detection_reads_what_routing_reads() -> None:
    """`Detection` holds upstream's fields that routing reads, and nothing else."""
    assert tuple(field.name for field in fields(lang.Detection)) == DETECTED


def test_the_state_is_walked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    walks: list[object] = []
    walk = lang.text_leaves

    def counted(state: Any, limit: int = 0) -> list[str] | None:
        walks.append(state)
        return walk(state, limit)

    monkeypatch.setattr(lang, "text_leaves", counted)
    state = {"note": "the order is late\nwe waited", "messages": ["hello there", "gracias"]}
    lang.analyse(state)
    assert walks == [state]


@pytest.mark.parametrize(
    ("selector", "state", "names", "inline"),
    [
        ("laya-english", "x" * 100_000, ["q"], True),
        ("laya", "x" * 100_000, sorted(TYPED_DECISION_WORKFLOWS["customer_service"]), True),
        ("laya", {"note": "the order is late"}, ["q"], True),
        ("laya", {"note": "the order is late " * 200}, ["q"], False),
        ("laya", ["a"] * 3000, ["q"], False),
    ],
)
async def test_routing_leaves_the_loop_only_for_large_states(
    monkeypatch: pytest.MonkeyPatch, selector: str, state: Any, names: list[str], inline: bool
) -> None:
    """A selector or workflow is a look-up and a small state is read at once, on the loop; a
    state whose walk passes `INLINE_DETECTION_COST` is read on a thread, to the same route."""
    threads: list[object] = []
    to_thread = asyncio.to_thread

    async def counted(*args: Any) -> Any:
        threads.append(args)
        return await to_thread(*args)

    monkeypatch.setattr(asyncio, "to_thread", counted)
    request = _request(selector, state, names)
    assert await checkpoint_for(selector, request) == route(selector, state, names)
    assert (threads == []) is inline


def test_auto_routing_matches_upstream_router(upstream: Any) -> None:
    routed = set()
    for state in _corpus():
        questions = {"q": {"type": "noul", "instructions": "ok?"}}
        expected = upstream.route(state, questions)["model"]
        for selector in AUTO_SELECTORS:
            assert route(selector, state, questions) == expected, state
        routed.add(expected)
    assert routed == {"english", "multilingual"}


@pytest.mark.parametrize("workflow", sorted(TYPED_DECISION_WORKFLOWS))
def test_workflow_question_sets_route_to_typed_decisions(upstream: Any, workflow: str) -> None:
    ids = TYPED_DECISION_WORKFLOWS[workflow]
    questions = {name: {"type": "noul", "instructions": name} for name in sorted(ids)}
    state = "Mein Konto wurde zweimal belastet, bitte helfen Sie mir."
    assert upstream.route(state, questions)["model"] == "typed-decisions"
    assert route("laya", state, questions) == "typed-decisions"
    assert workflow_of(ids) == workflow
    # A superset or subset is not the workflow: detection decides.
    assert (
        route("laya", state, [*ids, "extra"])
        == upstream.route(state, {**questions, "extra": {}})["model"]
    )
    assert route("laya-auto", state, sorted(ids)[1:]) == "multilingual"


def test_direct_selectors_ignore_detection() -> None:
    german = "Mein Konto wurde zweimal belastet, bitte helfen Sie mir."
    workflow = TYPED_DECISION_WORKFLOWS["customer_service"]
    assert route("laya-english", german, workflow) == "english"
    assert route("laya-multilingual", "the order is late and we have to wait", []) == (
        "multilingual"
    )
    assert route("laya-typed-decisions", "hello", ["x"]) == "typed-decisions"
    with pytest.raises(ValueError, match="not a Laya selector"):
        route("von", "hello", ["x"])


def test_router_and_provider_import_without_torch() -> None:
    code = (
        "import sys; import decidealot.providers.laya.gateway.router, "
        "decidealot.providers.laya.descriptor; "
        "bad = [m for m in ('torch', 'transformers', 'numpy', 'laya') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])


# -- provider glue ---------------------------------------------------------------------------

CONTRACT_MODELS = [
    ("laya", "Laya System One decisions with automatic checkpoint routing."),
    ("laya-auto", "Alias for laya with automatic checkpoint routing."),
    ("laya-latest", "Alias for the current Laya release."),
    ("laya-english", "Laya English checkpoint for English Latin-script content."),
    ("laya-multilingual", "Laya multilingual checkpoint for other languages and scripts."),
    ("laya-typed-decisions", "Laya checkpoint tuned for structured workflow decisions."),
]


def route(selector: str, state: Any, names: Iterable[str]) -> str:
    """What `checkpoint_for` answers, off the loop."""
    return named_checkpoint(selector, names) or detect_checkpoint(state)


def _request(model: str, state: Any, names: list[str]) -> SystemOneRequest:
    questions = {name: {"type": "noul", "instructions": "Is it late?"} for name in names}
    return msgspec.convert(
        {"model": model, "state": state, "questions": questions}, SystemOneRequest
    )


async def test_provider_lists_the_contract_models() -> None:
    provider = CheckpointProvider("laya", None, SELECTORS, checkpoint_for)  # type: ignore[arg-type]
    assert provider.name == "laya" and provider.local is True
    models = await provider.models()
    assert [(m.name, m.description) for m in models] == CONTRACT_MODELS
    assert {m.release_date for m in models} == {"2026-09-23"}


@pytest.mark.parametrize(
    ("selector", "state", "names", "checkpoint"),
    [
        ("laya", "the order is late and we have been waiting for it", ["late"], "english"),
        (
            "laya-auto",
            "Mein Konto wurde zweimal belastet, bitte helfen Sie mir.",
            ["x"],
            "multilingual",
        ),
        ("laya-latest", "注文が届きません", ["x"], "multilingual"),
        (
            "laya",
            "the order is late",
            sorted(TYPED_DECISION_WORKFLOWS["invoice_processing"]),
            "typed-decisions",
        ),
        ("laya-english", "注文が届きません", ["x"], "english"),
        ("laya-typed-decisions", "the order is late", ["x"], "typed-decisions"),
    ],
)
async def test_provider_routes_and_answers(
    selector: str, state: Any, names: list[str], checkpoint: str
) -> None:
    provider = CheckpointProvider("laya", None, SELECTORS, checkpoint_for)  # type: ignore[arg-type]
    job = await provider.accept(selector, _request(selector, state, names))
    assert isinstance(job, Job)  # ready to run: nothing to make in the gateway
    assert job.checkpoint == checkpoint
    assert job.state == state and list(job.questions) == names


def test_the_service_builds_a_worker_runtime_on_its_lane(tmp_path: Path) -> None:
    own = tmp_path / "my-english"
    settings = registry.settings(
        device="cpu", model_dir=tmp_path / "models", laya_english_checkpoint=own, torch_threads=3
    )
    (provider,) = build_providers(registry.replace(settings, von_enabled=False))
    assert isinstance(provider, CheckpointProvider)
    runtime = provider.runtime
    assert lane_of("laya", runtime, settings) == ("local", "models")
    assert runtime.name == "laya" and not runtime.loaded
    spec = runtime.spec
    assert spec.factory == "decidealot.providers.laya.worker.engine:create"
    assert spec.checkpoints == {
        "english": str(own),
        "multilingual": str(tmp_path / "models" / "laya-multilingual"),
        "typed-decisions": str(tmp_path / "models" / "laya-typed-decisions"),
    }
    assert spec.device == "cpu" and spec.torch_threads == 3
    assert isinstance(provider, CheckpointProvider)
