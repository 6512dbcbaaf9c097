"""Sphinx configuration for the dask_ps documentation.

Build (offline; nothing is fetched)::

    pip install -e ".[docs]"
    sphinx-build -b html docs docs/_build/html

numpydoc renders the NumPy-style docstrings when it is installed (the
``docs`` extra installs it), otherwise ``sphinx.ext.napoleon`` does. Markdown
pages (``benchmarks.md``) need ``myst-parser``; without it ``benchmarks.rst``
shows the same file as a literal block instead.
"""

from __future__ import annotations

import importlib.util
import os
import sys

sys.path.insert(0, os.path.abspath(".."))

import dask_ps

project = "dask_ps"
author = "dask_ps developers"
copyright = "2026, dask_ps developers"
release = dask_ps.__version__
version = ".".join(release.split(".")[:2])

extensions = ["sphinx.ext.autodoc"]
if importlib.util.find_spec("numpydoc") is not None:
    extensions.append("numpydoc")
    numpydoc_show_class_members = False  # api.rst lists members explicitly
    numpydoc_class_members_toctree = False
    numpydoc_validation_checks: set[str] = set()
else:
    extensions.append("sphinx.ext.napoleon")
    napoleon_google_docstring = False
    napoleon_numpy_docstring = True

HAVE_MYST = importlib.util.find_spec("myst_parser") is not None
source_suffix = {".rst": "restructuredtext"}
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
if HAVE_MYST:
    extensions.append("myst_parser")
    source_suffix[".md"] = "markdown"
    myst_heading_anchors = 3
    # benchmarks.md is a page of its own; the .rst fallback would duplicate it.
    exclude_patterns += ["benchmarks.rst", "benchmarks-history.rst"]

root_doc = "index"
language = "en"
pygments_style = "sphinx"
html_theme = "alabaster"
html_static_path: list[str] = []
html_title = f"dask_ps {release}"

autodoc_default_options = {
    "members": True,
    "member-order": "bysource",
    "show-inheritance": True,
}
autodoc_typehints = "description"
autodoc_class_signature = "mixed"

# ``sphinx-build -n`` (nitpicky) checks every cross-reference. These come from
# type hints and point at other projects' docs, which an offline build cannot
# link to (no intersphinx).
nitpicky = False
nitpick_ignore = [
    ("py:class", "Client"),
    ("py:class", "numpy.dtype"),
    ("py:class", "dask_ps._client.BlockPlacement"),
    ("py:class", "sklearn.base.BaseEstimator"),
    ("py:class", "sklearn.base.TransformerMixin"),
    ("py:class", "sklearn.base.ClassNamePrefixFeaturesOutMixin"),
    ("py:class", "sklearn.base.RegressorMixin"),
    ("py:class", "sklearn.linear_model._base.LinearClassifierMixin"),
    ("py:class", "sklearn.linear_model.SGDClassifier"),
    ("py:class", "sklearn.linear_model.SGDRegressor"),
    ("py:class", "dask_ps.linear_model._base._BaseSGDPS"),
    ("py:class", "dask_ps._estimators._params.PSEstimatorMixin"),
    ("py:mod", "dask_ps.linear_model._stochastic_gradient"),
]


def _skip_metadata_request_setters(app, what, name, obj, skip, options):
    """scikit-learn generates ``set_<method>_request`` for methods with
    arguments beyond X and y (LDA's ``transform(normalize=)``). Their
    docstrings cite scikit-learn's glossary and user guide
    (:term:`meta-estimator`, :ref:`metadata_routing`), which this build
    cannot resolve (two warnings); they are scikit-learn's API, documented
    there."""
    if name.startswith("set_") and name.endswith("_request"):
        return True
    return skip


def setup(app):
    app.connect("autodoc-skip-member", _skip_metadata_request_setters)
