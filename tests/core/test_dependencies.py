"""The private scikit-learn APIs dask_ps imports exist in the installed
version, and that version is inside the range ``pyproject.toml`` allows (the
range is what CI tests: a scikit-learn release outside it may have moved
them)."""

from __future__ import annotations

import importlib
import pathlib
import re

import pytest
import sklearn
from packaging.version import Version

import dask_ps

PRIVATE_SKLEARN = {
    "sklearn.base": ["_fit_context"],
    "sklearn.utils._param_validation": ["Interval", "StrOptions"],
    "sklearn.linear_model._base": ["LinearClassifierMixin", "SparseCoefMixin"],
    "sklearn.utils.multiclass": ["_check_partial_fit_first_call"],
    # scikit-learn's own input checks, so that errors on dask inputs read as
    # scikit-learn's (issue 24): the y checks and the feature-name and count
    # checks against a fitted estimator.
    "sklearn.utils.validation": ["_check_y", "_check_n_features", "_check_feature_names"],
}


def _pyproject():
    path = pathlib.Path(dask_ps.__file__).parent.parent / "pyproject.toml"
    if not path.exists():
        pytest.skip("not a source checkout")
    return path.read_text()


@pytest.mark.parametrize("module", sorted(PRIVATE_SKLEARN))
def test_private_sklearn_names_exist(module):
    mod = importlib.import_module(module)
    for name in PRIVATE_SKLEARN[module]:
        assert hasattr(mod, name), f"{module}.{name} is gone in scikit-learn {sklearn.__version__}"


def test_installed_sklearn_is_in_the_declared_range():
    spec = re.search(r'"scikit-learn([^"]*)"', _pyproject()).group(1)
    low = re.search(r">=\s*([\d.]+)", spec).group(1)
    high = re.search(r"<\s*([\d.]+)", spec).group(1)
    assert Version(low) <= Version(sklearn.__version__) < Version(high)


def test_every_private_sklearn_import_is_listed():
    """A new private import must be added to PRIVATE_SKLEARN (and so to the
    tested range's checks)."""
    found = set()
    for path in pathlib.Path(dask_ps.__file__).parent.rglob("*.py"):
        for m in re.finditer(r"from (sklearn[\w.]*) import ([^\n(]+|\([^)]*\))", path.read_text()):
            module, names = m.group(1), m.group(2).strip("()")
            names = re.sub(r"\s+as\s+\w+", "", names)  # an alias is ours, not scikit-learn's
            for name in re.split(r"[,\s]+", names):
                name = name.strip()
                if name in ("as",) or not name:
                    continue
                if not name or name.startswith("#"):
                    continue
                private_module = any(part.startswith("_") for part in module.split("."))
                if private_module or name.startswith("_"):
                    found.add((module, name))
    listed = {(m, n) for m, names in PRIVATE_SKLEARN.items() for n in names}
    assert found <= listed | _ALLOWED_SCIKIT_LEARN_SEMI_PUBLIC, sorted(found - listed - _ALLOWED_SCIKIT_LEARN_SEMI_PUBLIC)


# Private-looking names scikit-learn documents for estimator developers.
_ALLOWED_SCIKIT_LEARN_SEMI_PUBLIC = {
    ("sklearn.utils.validation", "_check_sample_weight"),
}
