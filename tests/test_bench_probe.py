"""bench.probe's machinery (the hostile probe's report, issue 44): the guarded run, what counts as output, the report."""

from __future__ import annotations

import os
import sys

from bench import probe


def test_a_guarded_run_records_the_error_line_and_the_watchdog_stops_a_run_at_its_limit(tmp_path):
    code = "import sys; print('2026-01-01 10:00:00,1 INFO x: noise', file=sys.stderr); sys.exit('error: bad input')"
    run = probe.execute([sys.executable, "-c", code], tmp_path, dict(os.environ), rss_cap=2**30)
    assert (run.exit, run.first_line, run.one_line, run.traceback) == (1, "error: bad input", True, False)
    assert run.cpu_seconds is not None and run.peak_process_mib > 0
    slow = probe.execute([sys.executable, "-c", "import time; time.sleep(30)"], tmp_path, dict(os.environ),
                         rss_cap=2**30, timeout=0.5)
    assert slow.exit == -9 and slow.killed.startswith("still running after")
    broken = probe.execute([sys.executable, "-c", "{}['x']"], tmp_path, dict(os.environ), rss_cap=2**30)
    assert broken.traceback and broken.last_line == "KeyError: 'x'" and not broken.one_line


def test_output_its_temporary_and_prefixes_count_as_inside_anything_else_is_outside():
    outputs = ["out", "w/o.jsonl", ".dense-partial*"]
    inside = ["out/a.ann", "out", ".out.linker-tmp-1/a.txt", "w/o.jsonl", "w/.o.jsonl.tmp", ".dense-partial-ab/x.npy"]
    outside = ["v/n.ann", "outx/a", "w/p.jsonl", "x/.out.tmp"]
    assert all(probe._inside(k, outputs) for k in inside)
    assert not any(probe._inside(k, outputs) for k in outside)


def test_the_report_shows_both_sides_per_variant_and_what_was_not_run():
    run = probe.Run(0, "wrote x", "wrote x", False, 1.5, 100.0, 90.0)
    variant = {"variant": "../v/n", "command": "linker extract --input a.jsonl", "run": run.__dict__, "intact": False,
               "outside": ["v/n.ann"], "facts": {"problems": ["x"]}, "problems": ["input changed: v/n.txt"],
               "held": False}
    cache = {"before": {"cases": [{"id": "1", "variants": [variant]}], "runs": []}}
    text = "\n".join(probe.render(cache))
    assert "| 1 a document id becomes an output path | ../v/n | 0 / – | `wrote x` | not run | **no** / – |" in text
    assert "- **after**: not run yet." in text and "`linker extract --input a.jsonl`" in text
    assert "  - before: input changed: v/n.txt; last line `wrote x`" in text
