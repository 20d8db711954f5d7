"""MkDocs hooks: the committed reports under eval/ become pages of the site.

The pages link to reports as `../eval/STUDY/REPORT.md`, which is right when the Markdown is read in the repository.
For the site, those files are added under `eval/` and the links rewritten to match, so that `mkdocs build --strict`
checks every link from a page to a report (a deleted or moved report fails the build).
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
EVAL_LINK = re.compile(r"\]\((?:\.\./)+eval/")


def on_files(files, config):
    for path in sorted((ROOT / "eval").rglob("*")):
        if path.is_file() and not path.name.startswith("."):
            files.append(File(path.relative_to(ROOT).as_posix(), str(ROOT), config["site_dir"],
                              config["use_directory_urls"]))
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri.startswith("eval/"):
        return markdown
    return EVAL_LINK.sub("](" + "../" * page.file.src_uri.count("/") + "eval/", markdown)
