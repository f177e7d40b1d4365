"""docs/performance.md shows the numbers benchmarks/results/ holds, and only those.

Every table of the page is rendered from the benchmark JSON by
benchmarks/docs_tables.py. A number edited by hand on the page, or a new run's
JSON saved without `python benchmarks/docs_tables.py`, makes the page and the
JSON disagree, and a table pasted onto the page outside the markers would not
be checked at all: both fail here. Reads JSON and markdown only (no TensorFlow).
"""

import pytest

from benchmarks import docs_tables

RENDERED = docs_tables.render_tables()


@pytest.mark.parametrize("name", list(docs_tables.TABLES))
def test_page_table_matches_the_benchmark_json(name):
    page = docs_tables.page_of(name)
    on_page = docs_tables.page_tables(page.read_text())
    assert name in on_page, f"no `<!-- table: {name} -->` ... `<!-- /table -->` on {page.name}"
    assert on_page[name] == RENDERED[name], (
        f"table {name} on {page.name} differs from the JSON; "
        "run `python benchmarks/docs_tables.py` after a new benchmark run"
    )


@pytest.mark.parametrize("page", docs_tables.pages(), ids=lambda page: page.name)
def test_every_table_on_the_page_is_generated(page):
    unmarked = docs_tables.unmarked_table_lines(page.read_text())
    assert not unmarked, (
        f"table lines outside the markers of a generated table, {page.name} "
        f"lines {unmarked}: render them in benchmarks/docs_tables.py instead"
    )
