"""What two requests must agree on before one may answer for the other: the semantic guard.

An embedding says two questions are *about* the same thing; it does not say they ask for the same
answer. "What is 2+3?" and "What is 2+4?" score about 0.82 under all-MiniLM-L6-v2, "Paris,
France" and "Paris, Texas" higher still. So a candidate above the similarity threshold is
rejected when the two texts differ in any of these (each check is one function, measured
separately by ``continuum bench semantic``):

``numbers``
    The multiset of numbers, with small number words folded to digits ("two" -> 2) and
    thousands separators removed, plus the arithmetic operators written between numbers.
``quotes``
    Strings in quotes or backticks. A quoted string in one text must appear (case-folded) in the
    other, quoted or not.
``negation``
    The count of negation markers (not, no, never, n't, without, none, cannot, except, ...).
``entities``
    Capitalised words that do not start a sentence, acronyms and mixed-case names (iPhone). An
    entity of one text must appear, case-folded, somewhere in the other.
``substitution``
    The two texts share most of their content words but each has a content word the other lacks:
    a one-word swap ("raw" -> "cooked", "buy" -> "sell", "python" -> "rust") on an otherwise
    identical request. Additions alone ("capital of France" -> "capital city of France") pass.

The guard is deliberately conservative: it also rejects some true paraphrases (a synonym swap on
an otherwise identical sentence). A rejected paraphrase costs one cold call; a wrong hit returns
a wrong answer.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from difflib import SequenceMatcher

_SMALL = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13,
    "fourteen": 14, "fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18,
    "nineteen": 19, "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60,
    "seventy": 70, "eighty": 80, "ninety": 90,
}  # fmt: skip
_SCALE = {"hundred": 100, "thousand": 1_000, "million": 1_000_000, "billion": 1_000_000_000}
_OPERATORS = {
    "+": "+", "plus": "+", "-": "-", "minus": "-", "*": "*", "x": "*", "×": "*", "times": "*",
    "multiplied by": "*", "/": "/", "÷": "/", "divided by": "/", "over": "/", "^": "^",
    "to the power of": "^",
}  # fmt: skip
_NEGATIONS = {
    "not", "no", "never", "without", "none", "nobody", "nothing", "neither", "nor", "cannot",
    "except", "excluding", "nowhere", "lack", "lacks", "lacking",
}  # fmt: skip
STOPWORDS = frozenset(
    """a an the and or but if then else of to in on at by for with from into onto about as is are
    was were be been being am do does did doing have has had having i me my we our you your he
    she it its they them their this that these those there here what which who whom whose when
    where why how can could would should will shall may might must please tell show give explain
    describe let know want need like just also any some all each every so than too very s t
    can't i'm it's what's whats how's hows that's there's let's up out over under again more
    most much many way ways thing things get got make made use using used one ones kind best
    good really actually quick quickly simple simply exactly briefly hey hi hello thanks thank
    could someone anyone help me mean means meaning""".split()  # noqa: SIM905
)

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9'’\-]*|\d[\d,]*(?:\.\d+)?")
_NUMBER = re.compile(r"(?<![\w.])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\w)|\d+(?:\.\d+)?")
_QUOTED = re.compile(r"\"([^\"]+)\"|“([^”]+)”|‘([^’]+)’|`([^`]+)`|(?<![\w])'([^']+)'(?![\w])")
_SENTENCE_START = re.compile(r"(?:^|[.!?:;]\s+|\n\s*|[\"“'‘(]\s*)$")
_OPERATOR_RE = re.compile(
    r"(\d)\s*(to the power of|multiplied by|divided by|plus|minus|times|over|[+\-*/x×÷^])\s*(?=\d)"
)


def _fold_number_words(text: str) -> str:
    """Rewrite runs of number words as digits: "twenty five" -> "25", "two" -> "2"."""
    words = re.split(r"(\W+)", text)
    out: list[str] = []
    i = 0
    while i < len(words):
        w = words[i].lower()
        if w in _SMALL or (w in _SCALE and out):
            total, current, j = 0, 0, i
            consumed = False
            while j < len(words):
                wj = words[j].lower()
                if wj in _SMALL:
                    current += _SMALL[wj]
                elif wj in _SCALE:
                    current = max(current, 1) * _SCALE[wj]
                    if _SCALE[wj] >= 1000:
                        total, current = total + current, 0
                elif (
                    wj.strip() in ("", "-", "and")
                    and j + 1 < len(words)
                    and (words[j + 1].lower() in _SMALL or words[j + 1].lower() in _SCALE)
                ):
                    pass
                else:
                    break
                consumed = True
                j += 1
            if consumed and w not in _SCALE:
                out.append(str(total + current))
                i = j
                continue
        out.append(words[i])
        i += 1
    return "".join(out)


def numbers(text: str) -> Counter[str]:
    folded = _fold_number_words(text)
    found: Counter[str] = Counter()
    for m in _NUMBER.finditer(folded):
        raw = m.group(0).replace(",", "")
        value = float(raw)
        found[repr(int(value)) if value.is_integer() else repr(value)] += 1
    for m in _OPERATOR_RE.finditer(folded.lower()):
        found["op:" + _OPERATORS[m.group(2)]] += 1
    return found


def quotes(text: str) -> set[str]:
    out = set()
    for m in _QUOTED.finditer(text):
        q = next(g for g in m.groups() if g is not None)
        q = " ".join(q.split()).casefold()
        if q:
            out.add(q)
    return out


def words(text: str) -> list[str]:
    return [w.casefold().replace("’", "'") for w in _WORD.findall(text)]


def negations(text: str) -> int:
    n = 0
    for w in words(text):
        if w in _NEGATIONS or w.endswith("n't"):
            n += 1
    return n


def entities(text: str) -> set[str]:
    """Capitalised words not at a sentence start, acronyms and mixed-case names, case-folded.
    Consecutive capitalised words are also kept joined ("New York")."""
    out: set[str] = set()
    run: list[str] = []
    for m in re.finditer(r"[A-Za-z][A-Za-z0-9'’\-.]*[A-Za-z0-9]|[A-Za-z]", text):
        w = m.group(0)
        starts = bool(_SENTENCE_START.search(text[: m.start()]))
        capital = w[0].isupper() and not starts
        inner = any(c.isupper() for c in w[1:]) or (w.isupper() and len(w) > 1)
        if (capital or inner) and w.casefold() not in STOPWORDS:
            name = w.rstrip(".").removesuffix("'s").removesuffix("’s")
            out.add(name.casefold())
            run.append(name.casefold())
        else:
            if len(run) > 1:
                out.add(" ".join(run))
            run = []
    if len(run) > 1:
        out.add(" ".join(run))
    return out


def stem(word: str) -> str:
    """A crude suffix stripper, enough to equate "reverse", "reversed" and "reverses"."""
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    for suffix in ("'s", "ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            break
    return word[:-1] if word.endswith("e") and len(word) > 3 else word


def content_words(text: str) -> set[str]:
    return {stem(w) for w in words(text) if w not in STOPWORDS and not w[0].isdigit()}


# -- the checks ------------------------------------------------------------------------------
def _numbers_differ(a: str, b: str) -> bool:
    na, nb = numbers(a), numbers(b)
    for n in (na, nb):  # "one"/"1" is mostly an article ("one more thing", "a banana")
        n.pop("1", None)
    ops_a = +Counter({k: v for k, v in na.items() if k.startswith("op:")})
    ops_b = +Counter({k: v for k, v in nb.items() if k.startswith("op:")})
    if not ops_a or not ops_b:  # "7 times 8" vs "multiply seven by eight": compare the numbers
        na, nb = na - ops_a, nb - ops_b
    return na != nb


def _quotes_differ(a: str, b: str) -> bool:
    fa, fb = " ".join(a.split()).casefold(), " ".join(b.split()).casefold()
    return any(q not in fb for q in quotes(a)) or any(q not in fa for q in quotes(b))


def _negation_differs(a: str, b: str) -> bool:
    return negations(a) != negations(b)


def _entities_differ(a: str, b: str) -> bool:
    wa, wb = " ".join(words(a)), " ".join(words(b))
    return any(e not in wb for e in entities(a)) or any(e not in wa for e in entities(b))


def _substitution(a: str, b: str) -> bool:
    """A near-duplicate in which a content word was swapped: at most three words differ on
    each side, at least 60% of the longer text is unchanged, and one changed span replaces a
    content word with a different one."""
    wa, wb = words(a), words(b)
    blocks = [
        op for op in SequenceMatcher(None, wa, wb, autojunk=False).get_opcodes() if op[0] != "equal"
    ]
    changed_a = sum(i2 - i1 for _, i1, i2, _, _ in blocks)
    changed_b = sum(j2 - j1 for _, _, _, j1, j2 in blocks)
    longest = max(len(wa), len(wb))
    if (
        not blocks
        or max(changed_a, changed_b) > 3
        or longest - max(changed_a, changed_b) < 0.6 * longest
    ):
        return False
    for tag, i1, i2, j1, j2 in blocks:
        if tag != "replace":
            continue
        old = {stem(w) for w in wa[i1:i2] if w not in STOPWORDS}
        new = {stem(w) for w in wb[j1:j2] if w not in STOPWORDS}
        if old and new and old != new:
            return True
    return False


CHECKS: dict[str, Callable[[str, str], bool]] = {
    "numbers": _numbers_differ,
    "quotes": _quotes_differ,
    "negation": _negation_differs,
    "entities": _entities_differ,
    "substitution": _substitution,
}


_CODE = re.compile(
    r"`|&&|\|\||==|!=|<=|>=|->|=>|\+\+|\+=|-=|\*=|::|[{}\[\];<>]|\w\(|#include|\$[A-Za-z_]"
)
_FUNCTION_WORDS = frozenset(
    """a an the and or of to in on at by for with from is are was be do does did how what which
    who when where why can could should would will i my me you your it this that there""".split()  # noqa: SIM905
)
MAX_WORDS = 60


def unjudgeable(text: str) -> str:
    """Why the guard cannot judge ``text`` (``""`` when it can): it was built and measured on
    short English requests in Latin script without code, and everything else fails closed —
    another script (``script``), code or operators (``code``: one symbol changes the meaning),
    no English function word in three or more words (``language``), or too long to compare
    detail by detail (``too_long``)."""
    if any(c.isalpha() and "LATIN" not in unicodedata.name(c, "") for c in text):
        return "script"
    if _CODE.search(text):
        return "code"
    found = [w.lower() for w in _WORD.findall(text)]
    if len(found) > MAX_WORDS:
        return "too_long"
    if len(found) >= 3 and not any(w in _FUNCTION_WORDS for w in found):
        return "language"
    return ""


@dataclass(frozen=True, slots=True)
class Guard:
    """The checks a semantic candidate must pass; ``Guard(checks=())`` turns the guard off."""

    checks: tuple[str, ...] = tuple(CHECKS)

    def __post_init__(self) -> None:
        unknown = [c for c in self.checks if c not in CHECKS]
        if unknown:
            from continuum.errors import InvalidRequest

            raise InvalidRequest(f"unknown guard checks {unknown}; known: {sorted(CHECKS)}")

    def rejects(self, a: str, b: str) -> str | None:
        """The first check on which ``a`` and ``b`` differ, or None when they may share an
        answer."""
        for name in self.checks:
            if CHECKS[name](a, b):
                return name
        return None

    @property
    def enabled(self) -> bool:
        return bool(self.checks)
