"""The numeric SUMMA_* settings: read one way, refused with one clear error."""

import pytest

from summa.backend import get_backend
from summa.settings import NUMBERS, check_numbers, number


@pytest.mark.parametrize("name", sorted(NUMBERS))
def test_each_numeric_setting_is_its_value_or_one_clear_error(monkeypatch, name):
    kind, least = NUMBERS[name]
    monkeypatch.delenv(name, raising=False)
    assert number(name, "default") == "default"
    monkeypatch.setenv(name, f" {kind(least + 3)} ")
    assert number(name, None) == kind(least + 3)
    check_numbers()
    for bad in ("lots", "1e400" if kind is float else "2.5", str(least - 1), "nan"):
        monkeypatch.setenv(name, bad)
        with pytest.raises(ValueError, match=f"^{name} must be"):
            get_backend("numpy")  # every entry point passes here before any work


def test_the_error_grace_falls_back_while_an_error_is_handled(monkeypatch):
    """__main__ asks SUMMA_ERROR_GRACE while it reports another error: a bad
    value gives the default there instead of hiding that error."""
    from summa import __main__ as main
    monkeypatch.setenv("SUMMA_ERROR_GRACE", "soon")
    assert main._grace() == main.ERROR_GRACE_SECONDS
    monkeypatch.setenv("SUMMA_ERROR_GRACE", "0.5")
    assert main._grace() == 0.5
