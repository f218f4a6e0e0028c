"""A small synthetic corpus of made-up facts, and questions answerable from it.

Fictional countries (capital, language, currency, founding year), inventors (birthplace,
birth year, invention) and devices (inventor, year, purpose), so that a search-using demo
cannot be solved from a model's memory. Two-hop questions ("In which country was the
inventor of the X born?") need two searches.

Everything is derived from fixed word lists with SHA-256, never from a random generator, so
the files are identical on every machine and Python version. The bundled copies under
``data/`` are regenerated (and checked by the tests) with::

    python -m toolrollout.search.demo_corpus
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

__all__ = [
    "DEMO_CORPUS_PATH",
    "DEMO_QUESTIONS_PATH",
    "build_demo_corpus",
    "build_demo_questions",
    "load_demo_questions",
    "write_demo_files",
]

_DATA: Final = Path(__file__).resolve().parent / "data"
DEMO_CORPUS_PATH: Final = _DATA / "demo_corpus.jsonl"
"""The bundled corpus, in Search-R1's layout (``{"id", "contents": "\\"Title\\"\\nbody"}``)."""
DEMO_QUESTIONS_PATH: Final = _DATA / "demo_questions.jsonl"
"""Questions about the corpus: ``{"question", "answer", "doc_ids", "hops"}``."""

_COUNTRIES: Final = 30
_INVENTORS: Final = 30

_T = TypeVar("_T")

_COUNTRY_HEADS = (
    "Vel", "Mar", "Tor", "Zan", "Kel", "Ost", "Bral", "Cyr", "Dov", "Eld", "Fen", "Gal",
    "Hes", "Ivr", "Jor", "Kest", "Lum", "Nor", "Pell", "Quar", "Ryn", "Sol", "Tav", "Ulm",
    "Vask", "Wyn", "Xan", "Yor", "Zeph", "Arn",
)  # fmt: skip
_COUNTRY_TAILS = ("oria", "avia", "endor", "ithia", "onia", "ara", "estan", "umbra", "alia")
_CITY_HEADS = (
    "Amber", "Silver", "Stone", "Frost", "Iron", "Copper", "Raven", "Thorn", "Willow",
    "Ember", "Salt", "Moss", "Glass", "Cinder", "Pine", "Gilt", "Storm", "Wolf", "Briar",
)  # fmt: skip
_CITY_TAILS = ("hold", "haven", "gate", "mere", "ford", "crest", "watch", "fall", "reach")
_LANGUAGE_TAILS = ("ish", "ese", "ic", "ari")
_COIN_HEADS = ("Gil", "Dra", "Qua", "Ster", "Ori", "Tal", "Mun", "Pex", "Vor", "Hal")
_COIN_TAILS = ("der", "mark", "lin", "rin", "tash", "ket")
_REGIONS = (
    "on the eastern shore of the Aster Sea",
    "in the highlands of the Corven Range",
    "on the island chain of the Merrow Archipelago",
    "in the river valleys of the Dunmere Basin",
    "on the steppes of the Ulvar Plains",
    "in the forests of the Hallow Weald",
)
_FIRST_NAMES = (
    "Orla", "Bram", "Ysolde", "Tamsin", "Corin", "Idris", "Maren", "Eskel", "Liora",
    "Tobiah", "Senna", "Ivo", "Rhea", "Caspian", "Nell", "Oswin", "Petra", "Dagny", "Lucan",
    "Wren",
)  # fmt: skip
_SURNAME_HEADS = ("Fen", "Hal", "Ash", "Mor", "Brack", "Quill", "Thorn", "Vane", "Cres", "Dray")
_SURNAME_TAILS = ("wick", "ford", "by", "ton", "well", "more", "holt", "stead")
_DEVICE_HEADS = ("Zor", "Quel", "Bry", "Thal", "Nyx", "Oss", "Vir", "Krel", "Sav", "Drom")
_DEVICE_TAILS = ("ath", "ine", "ex", "ium", "ora", "yx")
_DEVICE_KINDS: Final[tuple[tuple[str, str, str], ...]] = (
    ("lantern", "lamp", "light mine shafts without an open flame"),
    ("loom", "weaving machine", "weave patterned cloth from several threads at once"),
    ("compass", "navigation instrument", "find north inside iron-hulled ships"),
    ("engine", "steam engine", "drive the pumps of deep salt mines"),
    ("telescope", "optical instrument", "observe faint comets near the horizon"),
    ("press", "printing press", "print maps in four colours in a single pass"),
    ("clock", "water clock", "keep time on ships during long voyages"),
    ("pump", "hand pump", "lift water from wells more than fifty metres deep"),
    ("kiln", "pottery kiln", "fire glazed tiles at an even temperature"),
    ("harp", "musical instrument", "play chords that ring for a full minute"),
    ("sextant", "measuring instrument", "measure the height of stars above the sea"),
    ("bellows", "forge tool", "keep a forge fire hot with one hand"),
)


def _digest(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:8], "big")


def _pick(options: Sequence[_T], *key: object) -> _T:
    return options[_digest(*key) % len(options)]


def _names(
    heads: Sequence[str], tails: Sequence[str], count: int, salt: str, *, distinct_heads: bool
) -> list[str]:
    """``count`` distinct head+tail names in a fixed scrambled order (optionally no two
    sharing a head)."""
    candidates = sorted(((h, t) for h in heads for t in tails), key=lambda p: _digest(salt, *p))
    names: list[str] = []
    used_heads: set[str] = set()
    for head, tail in candidates:
        if distinct_heads and head in used_heads:
            continue
        used_heads.add(head)
        names.append(head + tail)
        if len(names) == count:
            return names
    raise ValueError(f"not enough distinct {salt} names")


@dataclass(frozen=True, slots=True)
class _Country:
    name: str
    capital: str
    language: str
    currency: str
    region: str
    founded: int


@dataclass(frozen=True, slots=True)
class _Inventor:
    name: str
    country: _Country
    born: int
    device: str
    kind: str
    purpose: str
    invented: int


def _world() -> tuple[list[_Country], list[_Inventor]]:
    country_names = _names(
        _COUNTRY_HEADS, _COUNTRY_TAILS, _COUNTRIES, "country", distinct_heads=True
    )
    capitals = _names(_CITY_HEADS, _CITY_TAILS, _COUNTRIES, "city", distinct_heads=False)
    currencies = _names(_COIN_HEADS, _COIN_TAILS, _COUNTRIES, "coin", distinct_heads=False)
    countries = []
    for index, name in enumerate(country_names):
        head = next(h for h in _COUNTRY_HEADS if name.startswith(h))
        countries.append(
            _Country(
                name=name,
                capital=capitals[index],
                language=head + _pick(_LANGUAGE_TAILS, "language", name),
                currency=currencies[index],
                region=_pick(_REGIONS, "region", name),
                founded=1100 + _digest("founded", name) % 700,
            )
        )
    surnames = _names(
        _SURNAME_HEADS, _SURNAME_TAILS, len(_SURNAME_HEADS), "surname", distinct_heads=True
    )
    people = [f"{first} {last}" for first in _FIRST_NAMES for last in surnames]
    people.sort(key=lambda name: _digest("person", name))
    devices = _names(_DEVICE_HEADS, _DEVICE_TAILS, _INVENTORS, "device", distinct_heads=False)
    inventors = []
    for index in range(_INVENTORS):
        person = people[index]
        noun, kind, purpose = _DEVICE_KINDS[index % len(_DEVICE_KINDS)]
        born = 1750 + _digest("born", person) % 120
        inventors.append(
            _Inventor(
                name=person,
                country=_pick(countries, "birthplace", person),
                born=born,
                device=f"{devices[index]} {noun}",
                kind=kind,
                purpose=purpose,
                invented=born + 22 + _digest("invented", person) % 30,
            )
        )
    return countries, inventors


def _slug(name: str) -> str:
    return name.lower().replace(" ", "-")


def _doc(kind: str, title: str, body: str) -> dict[str, str]:
    return {"id": f"{kind}-{_slug(title)}", "contents": f'"{title}"\n{body}'}


def build_demo_corpus() -> list[dict[str, str]]:
    """The corpus rows (Search-R1 layout), countries first, then inventors, then devices."""
    countries, inventors = _world()
    rows = [
        _doc(
            "country",
            c.name,
            f"{c.name} is a country {c.region}. Its capital and largest city is {c.capital}. "
            f"The official language of {c.name} is {c.language}, and its currency is the "
            f"{c.currency}. {c.name} was founded in {c.founded}.",
        )
        for c in countries
    ]
    rows += [
        _doc(
            "person",
            i.name,
            f"{i.name} (born {i.born}) is an inventor from {i.country.capital}, the capital of "
            f"{i.country.name}. {i.name.split()[0]} is best known for the {i.device}.",
        )
        for i in inventors
    ]
    rows += [
        _doc(
            "device",
            i.device,
            f"The {i.device} is a {i.kind} invented by {i.name} in {i.invented}. "
            f"It was designed to {i.purpose}.",
        )
        for i in inventors
    ]
    return rows


def build_demo_questions() -> list[dict[str, Any]]:
    """Questions with their answer, the ids of the documents needed, and the hop count."""
    countries, inventors = _world()

    def ids(kind: str, *titles: str) -> list[str]:
        return [f"{kind}-{_slug(t)}" for t in titles]

    questions: list[dict[str, Any]] = []
    for c in countries:
        questions.append(
            {
                "question": f"What is the capital of {c.name}?",
                "answer": c.capital,
                "doc_ids": ids("country", c.name),
                "hops": 1,
            }
        )
        questions.append(
            {
                "question": f"What is the currency of {c.name}?",
                "answer": c.currency,
                "doc_ids": ids("country", c.name),
                "hops": 1,
            }
        )
    for i in inventors:
        questions.append(
            {
                "question": f"Who invented the {i.device}?",
                "answer": i.name,
                "doc_ids": ids("device", i.device),
                "hops": 1,
            }
        )
        questions.append(
            {
                "question": f"In which year was the {i.device} invented?",
                "answer": str(i.invented),
                "doc_ids": ids("device", i.device),
                "hops": 1,
            }
        )
        questions.append(
            {
                "question": f"In which country was the inventor of the {i.device} born?",
                "answer": i.country.name,
                "doc_ids": ids("device", i.device) + ids("person", i.name),
                "hops": 2,
            }
        )
    return questions


def _jsonl(rows: Sequence[dict[str, Any]]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def write_demo_files(directory: Path = _DATA) -> tuple[Path, Path]:
    """Write ``demo_corpus.jsonl`` and ``demo_questions.jsonl`` into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    corpus, questions = directory / DEMO_CORPUS_PATH.name, directory / DEMO_QUESTIONS_PATH.name
    corpus.write_text(_jsonl(build_demo_corpus()), encoding="utf-8")
    questions.write_text(_jsonl(build_demo_questions()), encoding="utf-8")
    return corpus, questions


def load_demo_questions() -> list[dict[str, Any]]:
    """The bundled questions (``question``, ``answer``, ``doc_ids``, ``hops``)."""
    with DEMO_QUESTIONS_PATH.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


if __name__ == "__main__":
    for path in write_demo_files():
        print(f"wrote {path}")  # noqa: T201
