"""The docs pages render as written (#41): no literal backslash before a pipe in a table's code, and
no list item shown as text because the paragraph before it swallowed it.

Python-Markdown (what mkdocs uses) keeps a pipe inside a code span as text, so ``\\|`` there is
shown with its backslash (``N\\|auto``). Every page is rendered with the Markdown extensions
``mkdocs.yml`` names.
"""

from __future__ import annotations

import re

import markdown
import pytest
import yaml
from doc_blocks import ROOT, doc_pages

_CODE = re.compile(r"<code>(.*?)</code>", re.S)


def _extensions() -> tuple[list[str], dict[str, object]]:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    names: list[str] = []
    options: dict[str, object] = {}
    for entry in config["markdown_extensions"]:
        if isinstance(entry, dict):
            ((name, value),) = entry.items()
            names.append(name)
            options[name] = value or {}
        else:
            names.append(entry)
    return names, options


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_code_in_the_docs_shows_an_escaped_pipe(page) -> None:
    names, options = _extensions()
    html = markdown.markdown(page.read_text(), extensions=names, extension_configs=options)
    bad = [code for code in _CODE.findall(html) if "\\|" in code]
    assert not bad, f"{page.relative_to(ROOT)}: code renders a literal backslash before '|' (write '|'): {bad}"


_PRE = re.compile(r"<pre\b.*?</pre>", re.S)
_SWALLOWED_ITEM = re.compile(r"^\s*[-*] (?:<strong>|<code>|[A-Za-z])")


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_list_item_is_swallowed_by_the_paragraph_before_it(page) -> None:
    # An item that follows an indented block and a paragraph with no blank line between them is
    # read as that paragraph's next line: the page shows "- **Item**" as text, the list ends early.
    names, options = _extensions()
    html = _PRE.sub("", markdown.markdown(page.read_text(), extensions=names, extension_configs=options))
    bad = [line.strip()[:60] for line in html.splitlines() if _SWALLOWED_ITEM.match(line)]
    assert not bad, f"{page.relative_to(ROOT)}: list items rendered as text (a blank line is missing before): {bad}"


def test_the_readme_counts_the_runs_of_the_test_command() -> None:
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["envs"]["default"]["scripts"]
    runs = len(scripts["test"])
    word = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five"}[runs]
    readme = (ROOT / "README.md").read_text()
    assert f"in {word} runs" in readme, f"README.md: `hatch run test` is {runs} runs; say 'in {word} runs'"
    if runs != 2:
        assert "both runs" not in readme, f"README.md says 'both runs' of the {runs} runs of `hatch run test`"
