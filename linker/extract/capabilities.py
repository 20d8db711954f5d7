"""Capability suite of the adverse-event tagger, after MacPhail et al., "Evaluating the robustness of ADE
classification models using templates": sentences made from templates x fillers (drugs, symptoms), each
template saying whether its symptom is an adverse event of the drug (``linker/data/capabilities/extract/``,
versioned by its ``manifest.json``; the user's files of the same columns add rows).

What fails, per template (``expect``):

- ``event`` (baseline "{drug} gave me {symptom}", sentiment "I love {drug}, but it gave me {symptom}"): no
  positive AdverseEvent span overlaps the symptom: the adverse event is missed;
- ``no_event`` (negation "No {symptom} since starting {drug}", temporal "My {symptom} started before I began
  {drug}", beneficial "{drug} cleared my {symptom}", hypothetical "If you develop {symptom} ..."): a positive
  AdverseEvent span overlaps the symptom, so `annotate` would code it as an adverse event of the drug. A
  template without {symptom} ("I hate {drug}, the pills are huge") fails on any positive AdverseEvent span.

A negated, hypothetical or TherapeuticEffect span over the symptom is the right answer for ``no_event``; so is no
span at all, which is why each row also says how often the symptom was found as an AdverseEvent of any status.
The sampling and the intervals are the linking suite's (`linker.eval.capabilities`): up to `per_template`
(drug, symptom) pairs per template, drawn by a generator seeded by (seed, template); Wilson 95% intervals.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from linker.errors import InputFormatError, shorten
from linker.eval.capabilities import (
    CapabilityReport,
    CapabilityRow,
    _lines,
    _rng,
    _rows,
    _sample,
    wilson_interval,
)
from linker.extract.data import AE
from linker.fileio import iter_lines

DATA = "data/capabilities/extract"
PER_TEMPLATE = 40
SEED = 15
EXPECT = ("event", "no_event")
SLOTS = ("drug", "symptom")  # filler slots; a template may also hold {symptom2}: a second, different symptom
TEMPLATE_SLOTS = (*SLOTS, "symptom2")
_SLOT = re.compile(r"\{(\w+)\}")
DESCRIPTIONS = {  # of the package's capabilities; a user's is described by its expectation
    "baseline": "symptom after the drug: the adverse event must be found",
    "negation": "symptom negated: no event",
    "temporal": "symptom began before the drug: no event",
    "beneficial": "the drug relieved the symptom: no event",
    "hypothetical": "symptom conditional or feared: no event",
    "sentiment": "sentiment words, with an adverse event (found) or without one (none)",
    "coordination": "two symptoms after the drug, joined by 'and': each must be its own adverse event",
}


@dataclass(frozen=True)
class Template:
    capability: str
    expect: str
    text: str
    origin: str  # file:line


@dataclass(frozen=True)
class Case:
    capability: str
    expect: str
    origin: str
    text: str
    symptom: tuple[int, int] | None  # offsets of the symptom in `text`; None for a template without one
    other: tuple[int, int] | None = None  # offsets of {symptom2}: an `event` case then needs a span for each alone


@dataclass(frozen=True)
class SuiteData:
    version: str
    templates: tuple[Template, ...]
    fillers: dict[str, tuple[str, ...]]  # slot -> values
    sha256: dict[str, str]


def read_templates(path, lines) -> list[Template]:
    out = []
    for number, (capability, expect, text) in _rows(path, lines, 3, "capability<TAB>expect<TAB>template"):
        slots = set(_SLOT.findall(text))
        if (expect not in EXPECT or "drug" not in slots or not slots <= set(TEMPLATE_SLOTS) or not capability.strip()
                or ("symptom2" in slots and "symptom" not in slots)):
            raise InputFormatError(path, "a capability, expect event|no_event, a template with {drug} and at most "
                                   "{symptom} and {symptom2}", shorten(f"{capability} {expect} {text}"), line=number)
        if expect == "event" and "symptom" not in slots:
            raise InputFormatError(path, "an `event` template holding {symptom}", shorten(text), line=number)
        out.append(Template(capability.strip(), expect, text, f"{Path(str(path)).name}:{number}"))
    return out


def read_fillers(path, lines) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for number, (slot, value) in _rows(path, lines, 2, "slot<TAB>value"):
        if slot not in SLOTS or not value.strip():
            raise InputFormatError(path, f"slot {' or '.join(SLOTS)} and a value", shorten(f"{slot} {value}"),
                                   line=number)
        out.setdefault(slot, []).append(value.strip())
    return out


def load_suite(templates: Sequence[str | Path] = (), fillers: Sequence[str | Path] = (), *,
               package: bool = True) -> SuiteData:
    """The package's templates and fillers (unless `package` is False) plus the rows of the user's files."""
    root = resources.files("linker") / DATA
    sources = []  # (name, numbered lines, reader)
    if package:
        for name, reader in (("templates.tsv", read_templates), ("fillers.tsv", read_fillers)):
            sources.append((name, _lines((root / name).read_text(encoding="utf-8")), reader))
    sources += [(p, list(iter_lines(p)), read_templates) for p in templates]
    sources += [(p, list(iter_lines(p)), read_fillers) for p in fillers]
    found_t: list[Template] = []
    found_f: dict[str, list[str]] = {}
    sha = {}
    for name, lines, reader in sources:
        sha[str(name)] = hashlib.sha256("\n".join(line for _, line in lines).encode()).hexdigest()[:16]
        if reader is read_templates:
            found_t += read_templates(name, lines)
        else:
            for slot, values in read_fillers(name, lines).items():
                found_f.setdefault(slot, []).extend(values)
    missing = [s for s in SLOTS if not found_f.get(s)]
    if missing or not found_t:
        raise InputFormatError(", ".join(map(str, [*templates, *fillers])) or "suite data",
                               "templates, and drug and symptom fillers",
                               f"no {', '.join(missing) + ' fillers' if missing else 'templates'}")
    version = json.loads((root / "manifest.json").read_text(encoding="utf-8"))["version"] if package else "user"
    return SuiteData(version, tuple(found_t), {k: tuple(dict.fromkeys(v)) for k, v in found_f.items()}, sha)


def fill(template: str, values: dict[str, str]) -> tuple[str, tuple[int, int] | None]:
    """The sentence, sentence-initial letter capitalised, and the symptom's offsets in it."""
    text, spans = fill_slots(template, values)
    return text, spans.get("symptom")


def fill_slots(template: str, values: dict[str, str]) -> tuple[str, dict[str, tuple[int, int]]]:
    """The sentence, sentence-initial letter capitalised, and the offsets of each symptom slot in it."""
    text, spans = "", {}
    for i, part in enumerate(_SLOT.split(template)):
        if i % 2:  # a slot name
            if part.startswith("symptom"):
                spans[part] = (len(text), len(text) + len(values[part]))
            part = values[part]
        text += part
    return text[:1].upper() + text[1:], spans


def generate_cases(data: SuiteData, *, per_template: int = PER_TEMPLATE, seed: int = SEED) -> list[Case]:
    cases = []
    for tpl in data.templates:
        rng = _rng(seed, f"{tpl.capability} {tpl.text}")  # a template's cases do not depend on the other rows
        symptoms = [(s,) for s in data.fillers["symptom"]] if "{symptom}" in tpl.text else [("",)]
        if "{symptom2}" in tpl.text:
            symptoms = list(itertools.permutations(data.fillers["symptom"], 2))
        pairs = _sample(rng, list(itertools.product(data.fillers["drug"], symptoms)), per_template)
        for drug, (symptom, *second) in pairs:
            text, spans = fill_slots(tpl.text, {"drug": drug, "symptom": symptom, "symptom2": "".join(second)})
            cases.append(Case(tpl.capability, tpl.expect, tpl.origin, text, spans.get("symptom"), spans.get("symptom2")))
    return cases


def _overlaps(spans, span: tuple[int, int] | None, *, positive: bool):
    return [s for s in spans if s.label == AE and (not positive or s.status == "positive")
            and (span is None or (s.start < span[1] and span[0] < s.end))]


def _failed(case: Case, spans) -> bool:
    """An `event` case fails when a symptom has no positive AdverseEvent span of its own (one span over both
    symptoms of a coordination is one code for two events); a `no_event` case when either symptom has one."""
    targets = [case.symptom] + ([case.other] if case.other is not None else [])
    if case.expect == "no_event":
        return any(_overlaps(spans, target, positive=True) for target in targets)
    return not all(any(not (case.other is not None and _overlaps([s], rival, positive=True))
                       for s in _overlaps(spans, target, positive=True))
                   for target, rival in zip(targets, targets[::-1]))


def score(cases: Sequence[Case], predicted, *, label: str, config: dict | None = None,
          examples: int = 5) -> CapabilityReport:
    """One row per capability (`CapabilityRow`: failures, rate, Wilson interval) from the spans of each case;
    ``config["found"]`` holds per capability the share of cases whose symptom is an AdverseEvent of any status,
    ``config["failures"]`` up to `examples` failed sentences each, one per template."""
    rows, found, shown = [], {}, {}
    for capability in dict.fromkeys(c.capability for c in cases):
        members = [(c, spans) for c, spans in zip(cases, predicted, strict=True) if c.capability == capability]
        failed = []
        for case, spans in members:
            if _failed(case, spans):
                failed.append((case, spans))
        n, k = len(members), len(failed)
        low, high = wilson_interval(k, n)
        expects = sorted({c.expect for c, _ in members})
        described = DESCRIPTIONS.get(capability, f"expect {' / '.join(expects)}")
        rows.append(CapabilityRow(capability, described, n, k, k / n if n else float("nan"), low, high))
        with_symptom = [(c, s) for c, s in members if c.symptom is not None]
        found[capability] = (sum(bool(_overlaps(s, c.symptom, positive=False)) for c, s in with_symptom)
                             / len(with_symptom) if with_symptom else None)
        by_template: dict[str, tuple] = {}
        for case, spans in failed:
            by_template.setdefault(case.origin, (case, spans))
        shown[capability] = [{"text": c.text, "template": c.origin, "expect": c.expect,
                              "spans": [f"{s.label}/{s.status} {s.text!r}" for s in spans if s.label == AE]}
                             for c, spans in list(by_template.values())[:examples]]
    return CapabilityReport(label, "", tuple(rows), {}, {**(config or {}), "found": found, "failures": shown})


def run_suite(extractor, data: SuiteData | None = None, *, per_template: int = PER_TEMPLATE, seed: int = SEED,
              assertions: Sequence[str] = ("model", "rules"), style: str = "auto", lexicon=None
              ) -> list[CapabilityReport]:
    """The suite on an `Extractor`, once per assertion mode (`linker.extract.extractor.ASSERTIONS`): the model's
    status alone, and with the rule-based step. `lexicon`: the names of an index, as `annotate` gives the tagger
    (`linker.extract.lexicon_of`); None tags as `extract` does."""
    data = data or load_suite()
    cases = generate_cases(data, per_template=per_template, seed=seed)
    config = {"suite_data_version": data.version, "suite_data_sha256": data.sha256, "per_template": per_template,
              "seed": seed, "cases": len(cases), "templates": len(data.templates), "style": style,
              "model": extractor.revision, "interval": "Wilson score, 95%",
              "lexicon": getattr(lexicon, "source", None)}
    options = {"lexicon": lexicon} if lexicon is not None else {}
    reports = []
    for mode in assertions:
        predicted = extractor.extract([c.text for c in cases], style=style, assertion=mode, **options)
        reports.append(score(cases, predicted, label=f"assertion={mode}", config={**config, "assertion": mode}))
    return reports


__all__ = ["Case", "SuiteData", "Template", "fill", "fill_slots", "generate_cases", "load_suite", "run_suite", "score"]
