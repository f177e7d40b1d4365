"""docs/performance.md shows the numbers benchmarks/results/ holds, and only those.

Every table of the page is rendered from the benchmark JSON by
benchmarks/docs_tables.py. A number edited by hand on the page, or a new run's
JSON saved without `python benchmarks/docs_tables.py`, makes the page and the
JSON disagree, and a table pasted onto the page outside the markers would not
be checked at all: both fail here. Reads JSON and markdown only (no TensorFlow).
"""

import pytest

from benchmarks import docs_tables

PAGE_TEXT = docs_tables.PAGE.read_text()
RENDERED = docs_tables.render_tables()


@pytest.mark.parametrize("name", list(docs_tables.TABLES))
def test_page_table_matches_the_benchmark_json(name):
    on_page = docs_tables.page_tables(PAGE_TEXT)
    assert name in on_page, f"no `<!-- table: {name} -->` ... `<!-- /table -->` on the page"
    assert on_page[name] == RENDERED[name], (
        f"table {name} on {docs_tables.PAGE.name} differs from the JSON; "
        "run `python benchmarks/docs_tables.py` after a new benchmark run"
    )


def test_every_table_on_the_page_is_generated():
    unmarked = docs_tables.unmarked_table_lines(PAGE_TEXT)
    assert not unmarked, (
        f"table lines outside the markers of a generated table, {docs_tables.PAGE.name} "
        f"lines {unmarked}: render them in benchmarks/docs_tables.py instead"
    )
