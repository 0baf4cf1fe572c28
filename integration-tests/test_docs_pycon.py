"""Every ``pycon`` block of the docs and the README (an interactive Python session) runs as a doctest.

Like the ``console`` blocks (``test_docs_console.py``), a session whose output no longer matches
fails with the page and the line; ``<!-- docs-test: skip: REASON -->`` keeps one out.
"""

from __future__ import annotations

import doctest

import pytest
from doc_blocks import Block, blocks

PYCON = blocks("pycon")
RUNNABLE = [block for block in PYCON if not block.skip]


def test_every_pycon_block_not_run_says_why() -> None:
    assert all(len((block.skip or "").strip()) >= 10 for block in PYCON if block.skip)


@pytest.mark.parametrize("block", RUNNABLE, ids=[block.where for block in RUNNABLE])
def test_pycon_block_prints_what_it_quotes(block: Block) -> None:
    test = doctest.DocTestParser().get_doctest(block.text, {}, block.where, block.where, block.line)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    out: list[str] = []
    result = runner.run(test, out=out.append)
    assert result.failed == 0, f"{block.where}: the session printed something else:\n" + "".join(out)
