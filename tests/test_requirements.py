"""Which environments count as CI (where a missing requirement fails a test instead of skipping it)."""

from __future__ import annotations

import pytest

from tests.requirements import on_ci


@pytest.mark.parametrize("value, ci", [("true", True), ("1", True), ("yes", True), ("TRUE", True),
                                       ("github-actions", True), ("", False), ("false", False), ("False", False),
                                       ("0", False), (None, False)])
def test_any_ci_value_but_empty_false_or_0_counts_as_ci(value, ci):
    assert on_ci({} if value is None else {"CI": value}) is ci
