"""scispaCy's candidate generator (char 3-gram tf-idf + nmslib HNSW) as the peer of `bench.scale`.

Run by `python -m bench.scale peer` with the Python of a separate environment holding scispaCy
(``pip install scispacy==0.6.2 scipy==1.10.1``: its index builder refuses scipy >= 1.11), since scispaCy pins
numpy < 2. Standalone on purpose: it imports nothing of linker.

    PEER_PYTHON bench/peer_scispacy.py build KB.jsonl OUT      # prints {"build_seconds", "peak_rss_mib"}
    PEER_PYTHON bench/peer_scispacy.py serve KB.jsonl OUT QUERIES.txt   # FIRST ..., then RESULT {...}

The knowledge base is what scispaCy itself loads: one JSON line per concept (id, canonical name, aliases).
The builder is scispaCy's own `create_tfidf_ann_index`, with its settings (M=100, efConstruction=2000).
"""

import json
import resource
import sys
import time
from pathlib import Path


def rss() -> dict:
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            fields[key] = round(int(value.split()[0]) / 1024)
    return fields


def main() -> None:
    from scispacy.candidate_generation import CandidateGenerator, LinkerPaths, create_tfidf_ann_index
    from scispacy.linking_utils import KnowledgeBase

    command, kb_path, out = sys.argv[1], sys.argv[2], sys.argv[3]
    if command == "build":
        started = time.perf_counter()
        Path(out).mkdir(parents=True, exist_ok=True)
        create_tfidf_ann_index(out, KnowledgeBase(kb_path))
        print(json.dumps({"build_seconds": round(time.perf_counter() - started, 1),
                          "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}))
        return
    texts = Path(sys.argv[4]).read_text(encoding="utf-8").splitlines()
    aliases, vectorizer, ann_index = LinkerPaths.from_directory(out).load()
    generator = CandidateGenerator(ann_index=ann_index, tfidf_vectorizer=vectorizer,
                                   ann_concept_aliases_list=aliases, kb=KnowledgeBase(kb_path))
    first = generator([texts[0]], 5)
    print("FIRST " + json.dumps(first[0][0].concept_id if first[0] else None), flush=True)
    after_load = rss()
    times = []
    for _ in range(3):
        started = time.perf_counter()
        for start in range(0, len(texts), 256):
            generator(texts[start : start + 256], 5)
        times.append(time.perf_counter() - started)
    print("RESULT " + json.dumps({"queries": len(texts), "mentions_per_second": round(len(texts) / sorted(times)[1], 1),
                                  "pass_seconds": [round(t, 2) for t in times], "rss_after_load_mib": after_load,
                                  "rss_mib": rss()}), flush=True)


if __name__ == "__main__":
    main()
