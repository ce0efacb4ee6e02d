"""Language and script detection for choosing a Laya checkpoint (laya.md §7): a copy of
upstream `laya.lang` from the `laya` package 0.4.15 (Convai Innovations,
https://huggingface.co/convaiinnovations/laya), licensed under the Apache License 2.0 (its
`laya-0.4.15.dist-info/licenses/LICENSE`; http://www.apache.org/licenses/LICENSE-2.0).

Why a copy: it runs in the gateway, which must not import torch, and the `laya` package
requires torch and transformers (and `import laya.lang` loads numpy through the package's
`__init__`). The word lists, script ranges and thresholds are upstream's, unchanged, so routing
matches upstream exactly (tests/parity/test_laya_router.py compares both on every sample);
the code is restructured: JSON states only, no diagnostics, the state's string leaves read once
(`text_leaves`), and a typed `Detection` holding only what the router reads.

The one question routing asks: can the English checkpoint read this state? Script decides most
of it (any dominant non-Latin script is not English); for Latin text a stopword and diacritic
heuristic names the language or leaves it undecided.
"""

from __future__ import annotations

import bisect
import re
import unicodedata
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

# fmt: off
_SCRIPT_RANGES = [
    ("greek", ((0x0370, 0x03FF), (0x1F00, 0x1FFF))),
    ("cyrillic", ((0x0400, 0x052F), (0x2DE0, 0x2DFF), (0xA640, 0xA69F))),
    ("armenian", ((0x0530, 0x058F),)),
    ("hebrew", ((0x0590, 0x05FF),)),
    ("arabic", ((0x0600, 0x06FF), (0x0750, 0x077F), (0x08A0, 0x08FF), (0xFB50, 0xFDFF), (0xFE70, 0xFEFF))),  # noqa: E501
    ("devanagari", ((0x0900, 0x097F), (0xA8E0, 0xA8FF))),
    ("bengali", ((0x0980, 0x09FF),)),
    ("gurmukhi", ((0x0A00, 0x0A7F),)),
    ("gujarati", ((0x0A80, 0x0AFF),)),
    ("oriya", ((0x0B00, 0x0B7F),)),
    ("tamil", ((0x0B80, 0x0BFF),)),
    ("telugu", ((0x0C00, 0x0C7F),)),
    ("kannada", ((0x0C80, 0x0CFF),)),
    ("malayalam", ((0x0D00, 0x0D7F),)),
    ("sinhala", ((0x0D80, 0x0DFF),)),
    ("thai", ((0x0E00, 0x0E7F),)),
    ("lao", ((0x0E80, 0x0EFF),)),
    ("tibetan", ((0x0F00, 0x0FFF),)),
    ("myanmar", ((0x1000, 0x109F),)),
    ("georgian", ((0x10A0, 0x10FF),)),
    ("ethiopic", ((0x1200, 0x137F),)),
    ("khmer", ((0x1780, 0x17FF),)),
    ("hangul", ((0x1100, 0x11FF), (0x3130, 0x318F), (0xAC00, 0xD7AF))),
    ("kana", ((0x3040, 0x309F), (0x30A0, 0x30FF), (0x31F0, 0x31FF))),
    ("han", ((0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF))),
]

_FLATTENED_RANGES = sorted(
    ((lo, hi, script) for script, ranges in _SCRIPT_RANGES for lo, hi in ranges),
    key=lambda item: item[0],
)
_STARTS = [lo for lo, hi, script in _FLATTENED_RANGES]
_ENDS = [hi for lo, hi, script in _FLATTENED_RANGES]
_SCRIPTS = [script for lo, hi, script in _FLATTENED_RANGES]

_POST_DATABASE_LETTER_RANGES = (
    (0x01C89, 0x01C8A),   # CYRILLIC CAPITAL LETTER TJE
    (0x0A7CB, 0x0A7CD),   # LATIN CAPITAL LETTER RAMS HORN
    (0x0A7DA, 0x0A7DC),   # LATIN CAPITAL LETTER LAMBDA
    (0x10570, 0x1057A),   # VITHKUQI (Unicode 14)
    (0x1057C, 0x1058A),
    (0x1058C, 0x10592),
    (0x10594, 0x10595),
    (0x10597, 0x105A1),
    (0x105A3, 0x105B1),
    (0x105B3, 0x105B9),
    (0x105BB, 0x105BC),
    (0x105C0, 0x105F3),   # TODHRI (Unicode 16)
    (0x10D4A, 0x10D65),   # GARAY (Unicode 16)
    (0x10D6F, 0x10D85),
    (0x10EC2, 0x10EC4),   # ARABIC additions
    (0x10F70, 0x10F81),   # OLD UYGHUR (Unicode 14)
    (0x1123F, 0x11240),   # KHOJKI additions
    (0x11380, 0x11389),   # TULU-TIGALARI (Unicode 16)
    (0x1138B, 0x1138B),
    (0x1138E, 0x1138E),
    (0x11390, 0x113B5),
    (0x113B7, 0x113B7),
    (0x113D1, 0x113D1),
    (0x113D3, 0x113D3),
    (0x11BC0, 0x11BE0),   # SUNUWAR (Unicode 16)
    (0x11F02, 0x11F02),   # KAWI (Unicode 15)
    (0x11F04, 0x11F10),
    (0x11F12, 0x11F33),
    (0x12F90, 0x12FF0),   # CYPRO-MINOAN (Unicode 14)
    (0x1342F, 0x1342F),   # EGYPTIAN HIEROGLYPH additions
    (0x13441, 0x13446),
    (0x13460, 0x143FA),
    (0x16100, 0x1611D),   # GURUNG KHEMA (Unicode 16)
    (0x16A70, 0x16ABE),   # TANGSA (Unicode 14)
    (0x16D40, 0x16D6C),   # KIRAT RAI (Unicode 16)
    (0x18CFF, 0x18CFF),   # KHITAN SMALL SCRIPT addition
    (0x1B132, 0x1B132),   # HIRAGANA / KATAKANA additions
    (0x1B155, 0x1B155),
    (0x1DF25, 0x1DF2A),   # LATIN SMALL LETTER D WITH MID-HEIGHT LEFT HOOK
    (0x1E030, 0x1E06D),   # MODIFIER LETTER additions
    (0x1E290, 0x1E2AD),   # TOTO (Unicode 14)
    (0x1E4D0, 0x1E4EB),   # NAG MUNDARI (Unicode 15)
    (0x1E5D0, 0x1E5ED),   # OL ONAL (Unicode 16)
    (0x1E5F0, 0x1E5F0),
    (0x2B739, 0x2B739),   # CJK UNIFIED IDEOGRAPH extensions H and I
    (0x2EBF0, 0x2EE5D),
    (0x31350, 0x323AF),
)
_POST_DATABASE_LETTER_FLOOR = _POST_DATABASE_LETTER_RANGES[0][0]


def _is_letter(ch: str) -> bool:
    """A letter as the newest Unicode database says, whatever this interpreter ships."""
    if ch.isalpha():
        return True
    if ord(ch) < _POST_DATABASE_LETTER_FLOOR:
        return False
    if unicodedata.category(ch) != "Cn":
        return False
    cp = ord(ch)
    return any(lo <= cp <= hi for lo, hi in _POST_DATABASE_LETTER_RANGES)


_STOP = {
    "en": {"the", "and", "is", "are", "was", "were", "to", "of", "in", "for", "with", "that",
           "this", "it", "you", "have", "has", "not", "but", "on", "at", "be", "as", "from",
           "will", "can", "would", "there", "their", "what", "which", "please", "we", "i",
           "how", "why", "when", "where", "who", "whom", "does", "done", "doing", "been", "being",
           "could", "should", "might", "must", "shall", "doesn", "didn", "isn", "aren", "wasn",
           "weren", "haven", "hasn", "couldn", "wouldn", "won", "dont", "wont", "didnt", "doesnt",
           "isnt", "wasnt", "havent", "ive", "youre", "thats", "whats", "any", "some", "many",
           "much", "every", "each", "these", "those", "both", "few", "they", "them", "she", "him",
           "his", "our", "your", "yours", "into", "onto", "between", "after", "before", "through",
           "during", "without", "within", "down", "if", "nor", "than", "then", "because", "while",
           "until", "here", "only", "very", "too", "ever", "never", "always", "already", "yet"},
    "fr": {"le", "la", "les", "des", "une", "est", "pour", "dans", "que", "qui", "avec", "sur",
           "pas", "plus", "nous", "vous", "être", "cette", "mais", "sont", "ont", "aux", "ce",
           "et", "du", "au", "ou", "je", "tu", "il", "elle", "ils", "elles", "mon", "ton",
           "ma", "ta", "sa", "mes", "tes", "ses", "ces", "deux", "trois", "très", "bien",
           "tout", "tous", "toute", "fait", "veux", "veut", "peux", "peut", "dois", "doit",
           "merci", "bonjour", "jour", "jours", "mois", "fois", "quand", "comment", "pourquoi",
           "alors", "donc"},
    "de": {"der", "die", "das", "und", "ist", "ein", "eine", "den", "dem", "nicht", "mit", "für",
           "auf", "von", "zu", "sich", "auch", "werden", "wurde", "haben", "sind", "oder", "aber",
           "ich", "wir", "mir", "mich", "dir", "dich", "uns", "mein", "meine", "meinen",
           "meinem", "meiner", "diese", "dieser", "diesen", "dieses", "einen", "einem", "einer",
           "wie", "wo", "wann", "welche", "im", "zum", "zur", "aus", "bei", "nach", "noch", "bitte",
           "heute", "jetzt", "kann", "kannst", "habe", "gibt", "wird",
           "in", "was"},
    "es": {"el", "los", "las", "que", "por", "con", "para", "una", "es", "se", "del", "como",
           "pero", "son", "está", "este", "esta", "todo", "más", "muy", "hay", "sus",
           "la", "un", "y", "al", "lo", "le", "les", "su", "mi", "tu", "nos",
           "ni", "dos", "tres", "fue", "fueron", "ser", "tiene", "tienen", "tengo", "puede",
           "pueden", "quiero", "necesito", "hemos", "han", "sobre", "entre", "cuando", "donde",
           "porque", "aunque", "también", "ya", "eso", "esto", "esa", "ese", "nada", "algo",
           "aquí", "hoy", "gracias"},
    "pt": {"os", "as", "que", "em", "um", "uma", "para", "com", "não", "é", "se", "do", "da",
           "dos", "das", "mas", "são", "está", "este", "esta", "muito", "pelo", "pela",
           "o", "e", "na", "nas", "nos", "ao", "aos", "por", "foi", "era", "ser", "sou",
           "tem", "tenho", "pode", "podem", "quero", "preciso", "eu", "meu", "minha", "seu",
           "sua", "isso", "isto", "aqui", "ali", "como", "quando", "onde", "porque", "mais",
           "já", "ainda", "agora", "hoje", "ontem", "dois", "três", "tudo", "nada", "obrigado",
           "olá",
           "você", "vocês", "voce", "voces", "vc", "vcs", "nao", "sao", "ja", "até", "tá", "pra",
           "gostaria", "obrigada", "também", "tambem", "estou", "estamos", "meus", "minhas",
           "nosso", "nossa", "consigo", "cadê", "boa", "tarde", "noite",
           "depois", "antes", "então", "entao", "ninguém", "ninguem", "alguém", "alguem", "nenhum",
           "nenhuma", "estava", "ficou", "fiz", "deu"},
    "it": {"il", "lo", "gli", "che", "di", "per", "con", "non", "è", "si", "del", "della", "sono",
           "questo", "questa", "anche", "come", "più", "nella", "alla",
           "la", "le", "un", "uno", "una", "e", "ed", "o", "da", "su", "tra", "fra", "mi",
           "ci", "ne", "ho", "hai", "ha", "abbiamo", "avete", "hanno", "era", "stato", "stata",
           "devo", "deve", "devono", "voglio", "vorrei", "mio", "mia", "tuo", "sua", "quando",
           "dove", "perche", "molto", "poco", "sempre", "mai", "già", "ancora", "adesso", "oggi",
           "ieri", "grazie", "ciao", "scusa",
           "nel", "nell", "negli", "sul", "sulla", "sulle", "dal", "dalla", "dallo", "dagli", "dei",
           "delle", "dello", "degli", "agli", "alle", "col"},
    "nl": {"het", "een", "van", "is", "op", "te", "dat", "niet", "met", "voor", "zijn", "aan",
           "door", "maar", "ook", "worden", "deze", "naar", "wordt"},
    "sv": {"jag", "är", "och", "inte", "att", "från", "till", "behöver", "får", "skulle", "ska",
           "vill", "måste", "också", "dessa", "detta", "säger", "upp", "utan", "mitt", "min", "om",
           "kommer", "här", "två", "vi", "nästa", "gör", "göra",
           "hjälp", "hjälpa", "mig", "återbetalning", "återbetala", "faktura", "gång", "gånger",
           "hittar", "inställningen", "inställningarna", "lösenord", "när", "öppnar", "spårningen",
           "aterbetalning", "aterbetala", "behover", "fel", "ganger", "hjalp", "hjalpa",
           "installningen", "installningarna", "kraschar", "kvittot", "losenord", "nar",
           "oppnar", "paket", "skicka", "sparningen", "tva", "uppdaterats", "blivit", "debiterade",
           "appen"},
    "ro": {"și", "să", "este", "sunt", "care", "pentru", "din", "dar", "după", "până", "fără",
           "ale", "lui", "în", "fost", "acum", "vreau", "trebuie", "foarte", "acest", "această",
           "acesta", "aceasta", "mi", "ți", "vă", "nu"},
    "bn": {"ami", "amar", "amake", "amra", "amader", "apni", "apnar", "apnake", "apnara",
           "tumi", "tomar", "tomake", "tomra", "tader", "ota", "eita", "oita",
           "ekta", "ei", "oi", "ki", "keno", "kivabe", "kibhabe", "kothay", "kokhon", "kobe",
           "koto", "kintu", "jodi", "tahole", "ar", "theke", "jonno", "sathe", "shathe", "diye",
           "niye", "moddhe", "kore", "korte", "korchi", "korsi", "korbo", "korechi", "koreche",
           "korun", "koren", "korlam", "hobe", "hoyeche", "hoise", "hocche", "hoyni",
           "chai", "chaina", "lagbe", "parchi", "parbo", "parchina", "peyechi", "paini",
           "dite", "dilam", "diyechi", "nai", "khub", "onek", "ekhon", "akhon", "ekhono",
           "abar", "ekbar", "duibar", "ajke", "kalke", "taka", "bhalo", "valo", "kharap",
           "shomossa", "somossa", "dhonnobad", "bhai", "shob", "keu", "kichu", "bolte", "bolun",
           "parben", "asbe", "jabe", "pabo", "ferot", "dorkar", "hoye", "geche", "gese"},

    "az": {"və", "ve", "bir", "bu", "üçün", "ucun", "ilə", "ile", "olan", "olub", "olmasa",
           "var", "yox", "yoxdur", "mən", "sən", "biz", "siz", "onlar", "daha", "çox", "cox",
           "hər", "nə", "kimi", "görə", "sonra", "əgər", "eger", "deyil", "lakin", "amma",
           "ancaq", "artıq", "artiq", "də", "isə", "həm", "yalnız", "yalniz"},
}

_SHORT_SWEDISH_WORDS = {
    "åtkomst", "atkomst", "lösenord", "losenord", "fakturan", "betalningen", "inloggningen",
    "glömt", "glomt", "behöver", "behover", "återbetalning", "aterbetalning", "kvitto", "kvittot",
    "spårningen", "sparningen", "inställningen", "installningen", "felmeddelande",
    "abonnemanget",
}
_NON_EN_DIACRITICS = set(
    "àâäãáåçéèêëíìîïñóòôöõøúùûüýÿßæœ"          # Western European
    "ăâîșțşţ"                                   # Romanian
    "ąćęłńśźż"                                  # Polish
    "čďěňřšťůž"                                 # Czech / Slovak
    "őű"                                        # Hungarian
    "ğı"                                        # Turkish (text is lowercased before matching)
    "āēģīķļņūž"                                 # Baltic
    "đ"                                         # Serbo-Croatian / Vietnamese
    "ə"                                         # Azerbaijani
)
_SHARED_WORDS = {w for w in {word for words in _STOP.values() for word in words}
                 if sum(w in words for words in _STOP.values()) > 1}
_NORDIC_OVERLAP_WORDS = {
    "hej", "ja", "nej", "jo", "tack", "mig", "min", "om", "kommer", "får", "skulle", "vi",
}
_SHARED_WORDS.update(_NORDIC_OVERLAP_WORDS)
_EN_ONLY_WORDS = _STOP["en"] - _SHARED_WORDS
_EN_COLLISION_WORDS = {"come", "son", "do", "care", "todo", "im", "per", "plus"} & {
    w for lg, sw in _STOP.items() if lg != "en" for w in sw}

_WORD = re.compile(r"[^\W\d_]+", re.UNICODE)
_IDENTIFIER = re.compile(r"(?<![\w-])[\w-]*(?:[.@][\w-]+)+", re.UNICODE)
# fmt: on

NON_EN_DIACRITIC_RATE = 0.02
ENGLISH_RESCUE_DIACRITIC_RATE = 0.06
NON_LATIN_FRACTION = 0.2
NON_LATIN_MIN_FRACTION = 0.1
NON_LATIN_MIN_LETTERS = 10
MAX_CHARS = 4000

_CODE_LINE = re.compile(r"[=;{}\[\]]|\w\(")
_JOINED = re.compile(r"[^\W_][._/\\][^\W_]")
_LETTER_RUN = re.compile(r"[^\W\d_]{2,}")
_SHOUTED_MIN_STOPWORD = 4
_SHOUTED_MIN_WORD = 5


@dataclass(frozen=True, slots=True)
class Detection:
    """What routing reads of a state (upstream's `analyse` record, less what nobody reads)."""

    script: str
    """The dominant script: `latin`, a named non-Latin script, `other`, or `unknown` (no
    letters)."""
    is_english: bool
    """The English checkpoint can read it."""
    language_undecided: bool
    """Latin text whose language the heuristic could not name."""


class _Reading(NamedTuple):
    """One text's reading, with the evidence the per-line checks weigh."""

    script: str
    language: str | None
    is_english: bool
    language_undecided: bool
    diacritic_rate: float


def text_leaves(state: Any, limit: int = 0) -> list[str] | None:
    """String leaves of a state (object values, array items, depth first), at most 6 levels
    deep: the one walk of a state; every reading below works on its leaves. With a `limit`,
    None once the walk has cost more than it (a character of a leaf, or a value visited, is one)."""
    leaves: list[str] = []
    cost = 0
    stack: list[tuple[Any, int]] = [(state, 0)]
    while stack:
        value, depth = stack.pop()
        cost += 1
        if depth > 6 or value is None:
            pass
        elif isinstance(value, str):
            leaves.append(value)
            cost += len(value)
        elif isinstance(value, Mapping):
            stack.extend((item, depth + 1) for item in reversed(list(value.values())))
        elif isinstance(value, list | tuple):
            stack.extend((item, depth + 1) for item in reversed(value))
        if limit and cost > limit:
            return None
    return leaves


def detection_text(leaves: list[str], max_chars: int = MAX_CHARS) -> str:
    """The leaves joined by spaces, cut to `max_chars` (keys are ignored: usually English)."""
    parts: list[str] = []
    budget = max_chars
    for leaf in leaves:
        if budget <= 0:
            break
        if len(leaf) > budget:
            parts.append(leaf[:budget])
            break
        parts.append(leaf)
        budget -= len(leaf) + 1
    return " ".join(parts)[:max_chars]


def _is_latin_code_point(cp: int, ipa_limit: int) -> bool:
    """Latin below `ipa_limit`, Latin Extended Additional, or fullwidth Latin letters."""
    fullwidth = 0xFF21 <= cp <= 0xFF3A or 0xFF41 <= cp <= 0xFF5A
    return cp < ipa_limit or 0x1E00 <= cp <= 0x1EFF or fullwidth


def _named_script(cp: int) -> str | None:
    idx = bisect.bisect_right(_STARTS, cp) - 1
    if idx >= 0 and cp <= _ENDS[idx]:
        return _SCRIPTS[idx]
    return None


def _script_counts(text: str) -> dict[str, int]:
    """Letters per script; Latin is inserted last so a named script wins a tie with it."""
    if text.isascii():  # the common case, at C speed: every ASCII letter is Latin
        return {"latin": sum(map(str.isalpha, text))}
    counts: dict[str, int] = {}
    latin = 0
    for ch in text:
        if not _is_letter(ch):
            continue
        cp = ord(ch)
        if _is_latin_code_point(cp, 0x02B0):
            latin += 1
            continue
        name = _named_script(cp) or "other"
        counts[name] = counts.get(name, 0) + 1
    counts["latin"] = latin
    return counts


def _script_from_counts(counts: dict[str, int]) -> str:
    if not any(counts.values()):
        return "unknown"
    return max(counts.items(), key=lambda kv: kv[1])[0]


def _profile_from_counts(counts: dict[str, int]) -> dict[str, float]:
    total = sum(counts.values())
    if not total:
        return {}
    ordered: dict[str, int] = {}
    if counts.get("latin"):
        ordered["latin"] = counts["latin"]
    for name, value in counts.items():
        if name != "latin":
            ordered[name] = value
    return {k: v / total for k, v in ordered.items() if v}


def _non_latin_carries(non_latin: float, n_non_latin: int) -> bool:
    """Whether the non-Latin letters of a Latin-plurality text are enough to carry the state."""
    return non_latin >= NON_LATIN_FRACTION or (
        non_latin >= NON_LATIN_MIN_FRACTION and n_non_latin >= NON_LATIN_MIN_LETTERS
    )


def _script_of(ch: str) -> str | None:
    """The named non-Latin script of one letter, or None for Latin and unclaimed letters."""
    cp = ord(ch)
    if _is_latin_code_point(cp, 0x0250):
        return None
    return _named_script(cp)


def _non_latin_words(text: str) -> list[str]:
    """Same-script non-Latin runs of 2+ letters that are not capitalised (names) or symbols."""
    if text.isascii():  # no ASCII character belongs to a named non-Latin script
        return []
    runs: list[str] = []
    current, script = "", None
    for ch in text:
        if unicodedata.combining(ch):
            continue
        s = _script_of(ch)
        if s is not None and s == script:
            current += ch
            continue
        if current:
            runs.append(current)
        current, script = (ch, s) if s is not None else ("", None)
    if current:
        runs.append(current)
    return [w for w in runs if len(w) >= 2 and not w[0].isupper()]


def _english_rescued_by_words(words: list[str], diacritic_rate: float) -> bool:
    """Two English-only function words and at most one accented word outvote a low rate."""
    if diacritic_rate >= ENGLISH_RESCUE_DIACRITIC_RATE:
        return False
    if len(set(words) & _EN_ONLY_WORDS) < 2:
        return False
    return sum(1 for w in set(words) if any(ch in _NON_EN_DIACRITICS for ch in w)) <= 1


class _LatinEvidence(NamedTuple):
    """Latin-script language evidence of one text."""

    language: str | None
    diacritic_rate: float
    looks_non_english: bool


def _latin_profile(text: str) -> _LatinEvidence:
    """The language a Latin text names (or None), its diacritic rate, and whether it looks
    non-English even so."""
    words = _WORD.findall(_IDENTIFIER.sub(" ", text).replace("İ", "i").lower())
    lowered = text.lower()
    diacritics = sum(1 for ch in lowered if ch in _NON_EN_DIACRITICS)
    rate = diacritics / max(1, len(lowered))
    non_english = rate >= NON_EN_DIACRITIC_RATE
    word_set = set(words)
    nordic_overlap = bool(word_set & _NORDIC_OVERLAP_WORDS) and not bool(word_set & _EN_ONLY_WORDS)
    if 1 < len(words) < 4 and word_set & _SHORT_SWEDISH_WORDS:
        return _LatinEvidence("sv", rate, non_english)
    if len(words) < 4:
        return _LatinEvidence(None, rate, non_english or nordic_overlap)

    counts = Counter(words)
    scores = {
        lg: sum(1 if w in _EN_COLLISION_WORDS else n for w, n in counts.items() if w in sw)
        for lg, sw in _STOP.items()
    }
    en = scores.get("en", 0)
    evidenced = {
        lg: s
        for lg, s in scores.items()
        if lg != "en" and any(w not in _SHARED_WORDS for w in word_set & _STOP[lg])
    }
    best_lg, best = max(evidenced.items(), key=lambda kv: kv[1], default=(None, 0))

    # A short "kan inte ..." login request is Swedish despite one English-shaped token.
    swedish_phrase = (
        best_lg == "sv"
        and "inte" in words
        and "kan" in words
        and words[0] in {"kan", "jag", "vi"}
        and en <= 1
    )
    clear_margin = best >= max(2, en + 2) or (non_english and best >= max(2, en))
    lang = None
    if best_lg and (clear_margin or swedish_phrase):
        lang = best_lg
    elif en and (not non_english or _english_rescued_by_words(words, rate)):
        lang = "en"
    return _LatinEvidence(lang, rate, non_english or (lang is None and nordic_overlap))


def _shouted(text: str) -> bool:
    """A cased segment written entirely in capitals (caseless scripts are never shouted)."""
    return any(ch.isupper() for ch in text) and not any(ch.islower() for ch in text)


def _shouted_evidence(tokens: list[str], lang: str, diacritic_rate: float) -> bool:
    """Whether an all-caps line's evidence for `lang` is more than acronym-shaped tokens."""
    if not any(len(t) >= _SHOUTED_MIN_WORD for t in tokens):
        return False
    if diacritic_rate >= NON_EN_DIACRITIC_RATE:
        return True
    matched = {t.lower() for t in tokens} & _STOP.get(lang, set())
    return any(len(w) >= _SHOUTED_MIN_STOPWORD for w in matched)


def _blank_acronyms(text: str) -> str:
    return _LETTER_RUN.sub(lambda m: " " if m.group().isupper() else m.group(), text)


def _named_prose_language(segment: str) -> str | None:
    """The non-English language one prose line names with 4+ words and 2 distinct stopwords."""
    if not segment.strip() or _CODE_LINE.search(segment):
        return None
    prose = " ".join(tok for tok in segment.split() if not _JOINED.search(tok))
    shouted = _shouted(prose)
    if not shouted:
        prose = _blank_acronyms(prose)
    tokens = _WORD.findall(prose)
    if len(tokens) < 4:
        return None
    profile = _latin_profile(prose)
    lang = profile.language
    if lang in (None, "en"):
        return None
    if shouted and not _shouted_evidence(tokens, lang, profile.diacritic_rate):
        return None
    if len({w.lower() for w in tokens} & _STOP.get(lang, set())) < 2:
        return None
    return lang


def _non_english_segment(leaves: list[str], max_chars: int = MAX_CHARS) -> str | None:
    """The language of the first line or field, within `max_chars`, naming one."""
    seen = 0
    for leaf in leaves:
        for line in leaf.split("\n"):
            if seen >= max_chars:
                return None
            line = line[: max_chars - seen]
            seen += len(line)
            lang = _named_prose_language(line)
            if lang:
                return lang
    return None


def _read_text(text: str) -> _Reading:
    """The reading of one flattened string (the whole-state read)."""
    counts = _script_counts(text)
    profile = _profile_from_counts(counts)
    script = _script_from_counts(counts)
    non_latin = round(1.0 - profile.get("latin", 0.0), 4) if profile else 0.0
    n_non_latin = round(non_latin * sum(map(str.isalpha, text)))
    if script == "latin" and _non_latin_words(text) and _non_latin_carries(non_latin, n_non_latin):
        script = max((s for s in profile if s != "latin"), key=profile.get)  # type: ignore[arg-type]
    if script == "unknown":
        return _Reading("unknown", None, True, True, 0.0)
    if script != "latin":
        return _Reading(script, None, False, True, 0.0)
    latin = _latin_profile(text)
    lang = latin.language
    if lang not in (None, "en") and not _non_latin_carries(non_latin, n_non_latin):
        if _shouted(text):
            # An all-caps state must show more than acronyms before it is named foreign.
            if not _shouted_evidence(_WORD.findall(text), lang, latin.diacritic_rate):
                lang = None
        else:
            # Acronym-shaped capital runs inside mixed-case text do not vote.
            caps = [m.group() for m in _LETTER_RUN.finditer(text) if m.group().isupper()]
            if caps and not any(len(c) >= _SHOUTED_MIN_WORD for c in caps):
                blanked = _blank_acronyms(text)
                if blanked != text:
                    lang = _latin_profile(blanked).language
    undecided = lang is None
    english = lang == "en" or (undecided and not latin.looks_non_english)
    rate = round(latin.diacritic_rate, 4)
    return _Reading("latin", lang, english, undecided, rate)


def _leaf_non_english(leaf: str) -> _Reading | None:
    """The reading of the longest line of `leaf` that is not safe for English, else None."""
    best_letters = -1
    best: _Reading | None = None
    for line in leaf.split("\n"):
        if len(line) < 7:
            continue
        sample = line[:MAX_CHARS]
        if not sample.strip() or _CODE_LINE.search(sample):
            continue
        reading = _read_text(sample)
        if reading.is_english:
            continue
        named = reading.language not in (None, "en") and _named_prose_language(sample) is not None
        if not named:
            if reading.script not in ("latin", "unknown"):
                letters = sum(map(str.isalpha, sample))
                if not (_non_latin_words(sample) and letters >= NON_LATIN_MIN_LETTERS):
                    continue
            elif not (
                reading.diacritic_rate >= NON_EN_DIACRITIC_RATE and len(_WORD.findall(sample)) >= 4
            ):
                continue
        letters = sum(map(str.isalpha, sample))
        if letters > best_letters:
            best_letters, best = letters, reading
    return best


def analyse(state: Any, leaves: list[str] | None = None) -> Detection:
    """Upstream `laya.lang.analyse` for a JSON state, reduced to what routing reads; `leaves`
    is `text_leaves(state)` where the caller already has it.

    The whole state is read first (first 4000 characters of its leaves); a state that reads as
    English is then checked line by line and field by field, because one non-English message
    among English fields must still leave the English checkpoint.
    """
    if leaves is None:
        leaves = text_leaves(state) or []
    whole = _read_text(detection_text(leaves))
    result = Detection(whole.script, whole.is_english, whole.language_undecided)
    if (
        whole.script == "latin"
        and whole.is_english
        and (len(leaves) > 1 or any("\n" in leaf for leaf in leaves))
        and _non_english_segment(leaves)
    ):
        result = Detection("latin", is_english=False, language_undecided=False)
    if isinstance(state, str) or not result.is_english:
        return result
    best_letters = -1
    best: _Reading | None = None
    for leaf in leaves:
        reading = _leaf_non_english(leaf)
        if reading is None:
            continue
        letters = sum(map(str.isalpha, leaf[:MAX_CHARS]))
        if letters > best_letters:
            best_letters, best = letters, reading
    if best is None:
        return result
    return Detection(result.script, is_english=False, language_undecided=best.language_undecided)
