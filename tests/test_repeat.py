"""The flake finder (`scripts/test --repeat N`, `tests/support/repeat.py`): every chosen test runs N
times, and the summary lists each one that failed at least once, with how often."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.repeat import base_id

_REPO = str(Path(__file__).resolve().parents[1])

pytest_plugins = ["pytester"]

_CONFTEST = """
from tests.support.repeat import (
    _repeat_index, pytest_addoption, pytest_configure, pytest_generate_tests)
"""

_TESTS = """
import pytest

def test_steady():
    pass

def test_every_other(_repeat_index):
    # fails on every odd copy: a flake the finder must name, 2 times in 4
    assert _repeat_index % 2 == 0

@pytest.mark.parametrize("case", ["a", "b"])
def test_one_case_fails_once(case, _repeat_index):
    assert not (case == "b" and _repeat_index == 3)
"""


def test_lists_each_test_that_failed_at_least_once(pytester: pytest.Pytester) -> None:
    pytester.syspathinsert(_REPO)
    pytester.makeconftest(_CONFTEST)
    pytester.makepyfile(test_x=_TESTS)
    result = pytester.runpytest_inprocess("--repeat-each", "4", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=13, failed=3)
    summary = result.stdout.str().split("repeat: tests that failed at least once", 1)[1]
    assert "FLAKY 2/4 test_x.py::test_every_other\n" in summary
    assert "FLAKY 1/4 test_x.py::test_one_case_fails_once[b]\n" in summary
    assert "test_steady" not in summary and "[a]" not in summary


@pytest.mark.parametrize(
    ("nodeid", "base"),
    [
        ("tests/a.py::t[rep0]", "tests/a.py::t"),
        ("tests/a.py::t[rep12-x-y]", "tests/a.py::t[x-y]"),
        ("tests/a.py::t[x-rep2]@tests/a.py", "tests/a.py::t[x]"),
        ("tests/a.py::t[rep-x]", "tests/a.py::t[rep-x]"),
    ],
)
def test_the_repeat_index_is_not_part_of_the_name(nodeid: str, base: str) -> None:
    assert base_id(nodeid) == base
