from __future__ import annotations

import pytest

from qverify.errors import BadInput
from qverify.registry import Registry


def test_registry_rejects_duplicates_and_suggests():
    r: Registry[int] = Registry("thing")
    r.add("alpha", 1)
    r.add("alpha", 1)  # the same object again is fine (re-import)
    with pytest.raises(ValueError):
        r.add("alpha", 2)
    with pytest.raises(BadInput) as e:
        r.get("alpah")
    assert "did you mean 'alpha'" in str(e.value) and e.value.exit_code == 4
