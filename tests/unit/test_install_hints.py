"""Install hints name the install a user can run: the source checkout again for an editable install
(pip would otherwise look for hybridflow on a package index), the package otherwise."""

from __future__ import annotations

from pathlib import Path

import hybridflow
from hybridflow import installing


def test_an_editable_install_is_told_to_install_the_checkout_again(monkeypatch, tmp_path):
    checkout = Path(hybridflow.__file__).resolve().parent.parent  # the tests run from the checkout
    assert installing.source_checkout() == checkout
    monkeypatch.chdir(checkout)
    assert installing.install_extras("spark,ray") == "pip install -e '.[spark,ray]'"
    monkeypatch.chdir(tmp_path)
    assert installing.install_extras("ray") == f"pip install -e '{checkout}[ray]'"
    assert installing.install_extras() == f"pip install -e '{checkout}'"


def test_an_installed_package_is_told_to_install_the_package(monkeypatch):
    monkeypatch.setattr(installing, "source_checkout", lambda: None)
    assert installing.install_extras("ray") == "pip install 'hybridflow[ray]'"
    assert installing.install_extras() == "pip install 'hybridflow'"
