"""MkDocs hook: a page's links to repository files outside docs/ (an example plugin, a config) work on the site.

A linked file is published with the site under _repo/, so the link works offline and `mkdocs build --strict`
fails when the file is gone. A link to a folder outside docs/ keeps its text and loses the link: a static site
cannot list a folder. MkDocs' own checks flag every other broken link.
"""
from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, InclusionLevel

LINK = re.compile(r"\[([^\]]*)\]\(([^)\s#]+)[^)\s]*\)")  # [text](target#anchor)
PUBLISHED = "_repo"


def _leaving_docs(src_uri: str, target: str) -> str | None:
    """The link's path from docs/ when it is relative and leaves docs/ ("../examples/..."), else None."""
    if "://" in target or target.startswith(("/", "mailto:")):
        return None
    uri = posixpath.normpath(posixpath.join(posixpath.dirname(src_uri), target))
    return uri if uri.startswith("../") else None


def on_files(files, config):
    docs = Path(config.docs_dir).resolve()
    for page in list(files.documentation_pages()):
        for _, target in LINK.findall(Path(page.abs_src_path).read_text()):
            uri = _leaving_docs(page.src_uri, target)
            path = (docs / uri).resolve() if uri else None
            if path is None or not path.is_file() or docs.parent not in path.parents or files.get_file_from_path(uri):
                continue
            published = File(uri, src_dir=str(docs), dest_dir=config.site_dir, use_directory_urls=False,
                             inclusion=InclusionLevel.INCLUDED)
            published.dest_uri = f"{PUBLISHED}/{path.relative_to(docs.parent).as_posix()}"
            files.append(published)
    return files


def on_page_markdown(markdown, page, config, files):
    docs = Path(config.docs_dir).resolve()

    def unlink_folder(match: re.Match) -> str:
        uri = _leaving_docs(page.file.src_uri, match[2])
        return match[1] if uri and (docs / uri).is_dir() else match[0]

    return LINK.sub(unlink_folder, markdown)
