"""Every fenced block of the docs and the README is run or validated in a scratch project, so the docs
cannot drift from the code (the rules: docs/reference/docs-conventions.md)."""

from __future__ import annotations

import textwrap

import pytest

from tests.support.docblocks import REPO, Scratch, blocks, pages


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(REPO)))
def test_every_block_of_the_page_runs_or_validates(page, tmp_path):
    scratch = Scratch(tmp_path / "project")
    try:
        for block in blocks(page):
            scratch.check(block)
    finally:
        scratch.close()


def page_of(tmp_path, text: str):
    page = tmp_path / "page.md"
    page.write_text(textwrap.dedent(text))
    return Scratch(tmp_path / "project"), blocks(page)


def test_a_pipeline_block_that_drifted_from_the_model_fails_naming_page_line_and_key(tmp_path):
    scratch, [ok, drifted] = page_of(tmp_path, """\
        ```yaml
        schedule: {cron: "0 3 * * 1", timezone: UTC}
        ```

        ```yaml
        stages:
          clean: {run: stages.quickstart:clean, backnd: python}
        ```
        """)
    scratch.check(ok)
    with pytest.raises(AssertionError, match=r"(?s)page.md:5 .*backnd.*did you mean 'backend'"):
        scratch.check(drifted)


def test_shell_and_python_blocks_run_in_order_and_a_failing_one_fails(tmp_path):
    scratch, [init, write, read, broken] = page_of(tmp_path, """\
        ```bash
        mkdir made && cd made
        ```

        <!-- docs: file note.txt.py -->
        ```python
        NOTE = 1
        ```

        ```python
        import pathlib
        assert pathlib.Path("note.txt.py").exists() and pathlib.Path.cwd().name == "made"
        ```

        ```python
        raise SystemExit(3)
        ```
        """)
    for block in (init, write, read):
        scratch.check(block)
    with pytest.raises(AssertionError, match="exited 3"):
        scratch.check(broken)


def test_an_illustration_is_shown_unrun_but_must_still_parse(tmp_path):
    scratch, [cluster, broken] = page_of(tmp_path, """\
        <!-- docs: illustration (needs a Spark cluster) -->
        ```bash
        exit 1
        ```

        <!-- docs: illustration (a typo) -->
        ```python
        def f(:
        ```
        """)
    assert cluster.marker == "illustration" and cluster.arg == "(needs a Spark cluster)"
    scratch.check(cluster)
    with pytest.raises(SyntaxError):
        scratch.check(broken)
