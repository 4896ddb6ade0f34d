"""The evaluation's data: dictionaries built from labelled intent sets, with intents held out as
out-of-scope, and queries split into a calibration part and a report part.

- Banking77 and HWU64 (../shared/data/intent-eval/, CC BY 4.0): the dictionary of an in-scope
  intent is its tag and EXAMPLES examples drawn from the training split; calibration queries are
  other training-split queries (CAL_PER_INTENT per intent); the report uses the test split. The
  queries of held-out intents are out-of-scope in both parts.
- zh (eval/data/zh_intents.jsonl, written for this project): descriptions and examples per
  intent; its queries split half and half (by intent) into calibration and report; some intents
  held out; plus out-of-scope queries, also split.
- seed (eval/data/seed.json): the seed's cases on a demo-like dictionary; report only.
- small registries (:func:`small_registries`): dictionaries of 1, 2 and 3 tags drawn from
  each set, with the queries of those tags (in scope), queries of the set's other intents and
  of the other sets (out of scope) and other tags of the set read as words (out of scope);
  drawn separately from the calibration part and from the report part.
- small cases (eval/data/small_cases.json): the small-registry cases that must hold (one tag
  ``parity.echo`` and the tag ``parity.none``; two tags and "tell me a story"); report only.

Every choice is drawn from a fixed seed, so a run is reproducible.
"""

from __future__ import annotations

import csv
import json
import random
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHARED = HERE.parent.parent / "shared" / "data" / "intent-eval"
SEED = 20250112
EXAMPLES = 5  # examples per intent in a dictionary
CAL_PER_INTENT = 24  # calibration queries per intent (in-scope and held out)
HOLD_OUT = 0.25  # share of intents held out as out-of-scope


SMALL_SIZES = (1, 2, 3)  # tags per small registry
SMALL_REGISTRIES = 30  # registries per set, size and part
SMALL_IN = 8  # in-scope queries per tag of a small registry
SMALL_OUT = 12  # out-of-scope queries from the same set, per registry
SMALL_OTHER = 6  # out-of-scope queries from the other sets, per registry
SMALL_TAGS = 4  # other tags of the set read as words, per registry


@dataclass
class Query:
    text: str
    tag: str | None  # None: out of scope for this dictionary
    intent: str | None = None  # when given, the query is this tag (read as words), not text


@dataclass
class Dataset:
    """A dictionary (tag -> texts) and its two query parts."""

    name: str
    texts: dict[str, list[str]]
    cal: list[Query] = field(default_factory=list)
    report: list[Query] = field(default_factory=list)
    held_out: list[str] = field(default_factory=list)

    def summary(self) -> str:
        def count(qs: list[Query]) -> str:
            inside = sum(q.tag is not None for q in qs)
            return f"{inside} in scope + {len(qs) - inside} out"

        return (
            f"{self.name}: {len(self.texts)} intents in the dictionary, {len(self.held_out)} "
            f"held out; calibration {count(self.cal)}; report {count(self.report)}"
        )


def _split_intents(intents: list[str], rng: random.Random) -> tuple[list[str], list[str]]:
    shuffled = sorted(intents)
    rng.shuffle(shuffled)
    n_out = round(len(shuffled) * HOLD_OUT)
    return sorted(shuffled[n_out:]), sorted(shuffled[:n_out])


def _labelled(
    name: str,
    train: dict[str, list[str]],
    test: dict[str, list[str]],
    examples: int = EXAMPLES,
) -> Dataset:
    rng = random.Random(f"{SEED}:{name}")
    inside, held = _split_intents(list(train), rng)
    ds = Dataset(name, {}, held_out=held)
    for tag in sorted(train):
        pool = sorted(set(train[tag]))
        rng.shuffle(pool)
        if tag in inside:
            ds.texts[tag] = pool[:examples]
        rest = pool[examples:]
        label = tag if tag in inside else None
        ds.cal.extend(Query(t, label) for t in rest[:CAL_PER_INTENT])
        ds.report.extend(Query(t, label) for t in sorted(set(test.get(tag, ()))))
    return ds


def banking77(examples: int = EXAMPLES) -> Dataset:
    """Banking77: tags ``bank.CATEGORY`` (e.g. ``bank.card_arrival``)."""
    parts: dict[str, dict[str, list[str]]] = {}
    for split in ("train", "test"):
        by_tag: dict[str, list[str]] = defaultdict(list)
        with open(SHARED / "banking77" / f"{split}.csv", newline="", encoding="utf-8") as fh:
            for row in csv.DictReader(fh):
                by_tag[f"bank.{row['category'].lower()}"].append(row["text"].strip())
        parts[split] = by_tag
    return _labelled("banking77", parts["train"], parts["test"], examples)


def hwu64(examples: int = EXAMPLES) -> Dataset:
    """HWU64: tags ``SCENARIO.INTENT`` (e.g. ``alarm.query``, ``iot.hue_lightoff``)."""
    parts: dict[str, dict[str, list[str]]] = {}
    for split in ("train", "test"):
        by_tag: dict[str, list[str]] = defaultdict(list)
        for path in sorted((SHARED / "hwu64" / split).glob("*.csv")):
            with open(path, newline="", encoding="utf-8") as fh:
                for row in csv.DictReader(fh, delimiter=";"):
                    text = (row.get("answer_from_anno") or row.get("answer") or "").strip()
                    if text:
                        by_tag[f"{row['scenario']}.{row['intent']}"].append(text)
        parts[split] = by_tag
    return _labelled("hwu64", parts["train"], parts["test"], examples)


def zh(path: Path = HERE / "data" / "zh_intents.jsonl") -> Dataset:
    """The Chinese set: dictionary entries with descriptions, queries split by intent."""
    rng = random.Random(f"{SEED}:zh")
    entries: dict[str, list[str]] = {}
    queries: dict[str | None, list[str]] = defaultdict(list)
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        if "intent" in item:
            entries[item["intent"]] = [item["description"], *item["examples"]]
        else:
            queries[item["tag"]].append(item["query"])
    inside, held = _split_intents(list(entries), rng)
    ds = Dataset("zh", {t: entries[t] for t in inside}, held_out=held)
    for tag in sorted(queries, key=lambda t: t or ""):
        pool = list(queries[tag])
        rng.shuffle(pool)
        label = tag if tag in inside else None
        half = len(pool) // 2
        ds.cal.extend(Query(t, label) for t in pool[:half])
        ds.report.extend(Query(t, label) for t in pool[half:])
    return ds


@dataclass
class SeedCase:
    name: str
    query: Query
    never: str | None
    step: str  # "fallback" or "alias"
    required: bool = True  # False: a refusal is no failure (coverage, not safety)


def seed(
    path: Path = HERE / "data" / "seed.json",
) -> tuple[Dataset, dict[str, str], list[SeedCase]]:
    """The seed's cases: a dataset (report only), the alias map, and the cases."""
    data = json.loads(path.read_text(encoding="utf-8"))
    texts: dict[str, list[str]] = {}
    aliases: dict[str, str] = {}
    for entry in data["dictionary"]:
        texts[entry["tag"]] = [entry.get("description", ""), *entry.get("examples", [])]
        aliases.update((a, entry["tag"]) for a in entry.get("aliases", []))
    for agent in data["agents"]:
        for tag in agent["capabilities"]:
            texts.setdefault(tag, []).append(agent["description"])
    cases = [
        SeedCase(
            c["name"],
            Query(c.get("text", ""), c["expect"], c.get("intent")),
            c.get("never"),
            c.get("step", "fallback"),
            c.get("required", True),
        )
        for c in data["cases"]
    ]
    ds = Dataset("seed", texts, report=[c.query for c in cases if c.step == "fallback"])
    return ds, aliases, cases


def small_registries(sets: list[Dataset], part: str) -> list[tuple[int, Dataset]]:
    """Small registries ``(size, dataset)`` drawn from each set's ``part`` ("cal" or
    "report"): a dictionary of ``size`` in-scope intents of the set (their texts as in the big
    dictionary), up to SMALL_IN queries of each (in scope), SMALL_OUT queries of the set's
    other intents, in scope of the big dictionary or not, SMALL_OTHER queries of the other
    sets, and SMALL_TAGS other tags of the set (held out ones included) read as words, all
    out of scope."""
    out: list[tuple[int, Dataset]] = []
    every = {ds.name: list(getattr(ds, part)) for ds in sets}
    for ds in sets:
        tags = sorted(ds.texts)
        all_tags = sorted({*tags, *ds.held_out})
        mine = every[ds.name]
        others = [q for name, qs in every.items() if name != ds.name for q in qs]
        for size in SMALL_SIZES:
            rng = random.Random(f"{SEED}:small:{ds.name}:{size}:{part}")
            for i in range(SMALL_REGISTRIES):
                chosen = sorted(rng.sample(tags, size))
                small = Dataset(f"{ds.name}-small{size}-{i}", {t: ds.texts[t] for t in chosen})
                for t in chosen:
                    pool = [q for q in mine if q.tag == t]
                    small.report.extend(rng.sample(pool, min(SMALL_IN, len(pool))))
                outside = [q for q in mine if q.tag not in chosen]
                small.report.extend(
                    Query(q.text, None) for q in rng.sample(outside, min(SMALL_OUT, len(outside)))
                )
                small.report.extend(
                    Query(q.text, None) for q in rng.sample(others, min(SMALL_OTHER, len(others)))
                )
                words = [t for t in all_tags if t not in chosen]
                small.report.extend(
                    Query("", None, t) for t in rng.sample(words, min(SMALL_TAGS, len(words)))
                )
                out.append((size, small))
    return out


def small_cases(
    path: Path = HERE / "data" / "small_cases.json",
) -> list[tuple[str, Dataset, list[SeedCase]]]:
    """The small-registry cases: per registry its name, dictionary and cases."""
    data = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for reg in data["registries"]:
        texts: dict[str, list[str]] = {}
        for entry in reg["dictionary"]:
            texts[entry["tag"]] = [entry.get("description", ""), *entry.get("examples", [])]
        for agent in reg["agents"]:
            for tag in agent["capabilities"]:
                texts.setdefault(tag, [])
                if agent.get("description"):
                    texts[tag].append(agent["description"])
        cases = [
            SeedCase(
                c["name"],
                Query(c.get("text", ""), c["expect"], c.get("intent")),
                c.get("never"),
                c.get("step", "fallback"),
                c.get("required", True),
            )
            for c in reg["cases"]
        ]
        out.append((reg["name"], Dataset(reg["name"], texts), cases))
    return out


def all_sets(examples: int = EXAMPLES) -> list[Dataset]:
    """Banking77, HWU64 and zh (seed apart: see :func:`seed`)."""
    return [banking77(examples), hwu64(examples), zh()]
