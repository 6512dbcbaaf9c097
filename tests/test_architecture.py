"""The layering rules of ``docs/architecture.rst``, checked on the source.

- The pure core (consistency, placement, update rules, shard storage,
  routing, the oplog) imports neither ``distributed`` nor any dask_ps module
  outside the pure core, so it is tested without a cluster and can change
  without touching the Dask adapters.
- Estimators (``dask_ps.linear_model``, ``dask_ps.decomposition``) use the
  public ``dask_ps`` API and the shared estimator package
  ``dask_ps._estimators`` only: no session, transport, plugin or backend
  internals. The shared package is the one place that may reach into Dask
  internals, behind ``_dask_adapter``.
- No module over 900 lines and no function over 80 lines (docstring not
  counted), except the compiled kernels listed in ``LONG_FUNCTIONS``.
"""

from __future__ import annotations

import ast
import pathlib

import dask_ps

PKG = pathlib.Path(dask_ps.__file__).parent

PURE_CORE = {
    "_backend", "_config", "_exceptions", "_spec", "_routing", "_oplog", "_shard", "_sums", "_placement",
    "rules", "consistency", "_sparse_rows", "_compiled",
}
ESTIMATOR_PACKAGES = ("linear_model", "decomposition")
SHARED_ESTIMATOR_PACKAGE = "_estimators"

# Functions allowed over the length limit, with the reason (also in docs/architecture.rst).
LONG_FUNCTIONS = {
    ("_sgd_numba.py", "_sgd_round"): "one compiled loop over a round's samples; numba inlines no closures",
    ("_lda_kernels.py", "gibbs_sweep_sparse"): "one compiled SparseLDA sweep; split, its buckets would be recomputed",
}
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 900


def _modules(root=PKG):
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _imports(path: pathlib.Path) -> list[str]:
    """Every module name imported anywhere in the file (function bodies too),
    ``from a import b`` giving both ``a`` and ``a.b``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
            out.extend(f"{node.module}.{a.name}" for a in node.names)
    return out


def test_pure_core_imports_no_dask_adapter():
    offenders = []
    for name in sorted(PURE_CORE):
        path = PKG / f"{name}.py"
        assert path.exists(), f"pure-core module {name} moved: update PURE_CORE and docs/architecture.rst"
        for mod in _imports(path):
            parts = mod.split(".")
            if parts[0] == "distributed":
                offenders.append((name, mod))
            elif parts[0] == "dask_ps" and len(parts) > 1 and parts[1] not in PURE_CORE:
                offenders.append((name, mod))
    assert not offenders, f"the pure core imports Dask adapters: {offenders}"


def test_estimators_import_only_public_api_and_the_shared_package():
    offenders = []
    for pkg in ESTIMATOR_PACKAGES:
        for path in _modules(PKG / pkg):
            for mod in _imports(path):
                parts = mod.split(".")
                if parts[0] != "dask_ps" or len(parts) == 1:
                    continue
                if parts[1] in ESTIMATOR_PACKAGES or parts[1] == SHARED_ESTIMATOR_PACKAGE:
                    continue
                if parts[1].startswith("_"):
                    offenders.append((f"{pkg}/{path.name}", mod))
            # ``dask_ps._x`` as an attribute is a private import too
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                        and node.value.id == "dask_ps" and node.attr.startswith("_")
                        and node.attr != SHARED_ESTIMATOR_PACKAGE):
                    offenders.append((f"{pkg}/{path.name}", f"dask_ps.{node.attr}"))
    assert not offenders, f"estimators use private dask_ps modules: {offenders}"


def test_only_the_dask_adapter_touches_distributed_internals():
    """In the shared estimator package, ``distributed`` internals (anything
    beyond the top-level public names) appear in ``_dask_adapter`` only."""
    shared = PKG / SHARED_ESTIMATOR_PACKAGE
    offenders = []
    for path in _modules(shared):
        if path.name == "_dask_adapter.py":
            continue
        for mod in _imports(path):
            parts = mod.split(".")
            if parts[0] == "distributed" and len(parts) > 2:
                offenders.append((path.name, mod))
    assert shared.exists()
    assert not offenders, f"distributed internals outside _dask_adapter: {offenders}"


def test_module_and_function_sizes():
    too_long = []
    for path in _modules():
        text = path.read_text()
        n_lines = text.count("\n")
        if n_lines > MAX_MODULE_LINES:
            too_long.append((str(path.relative_to(PKG)), "module", n_lines))
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
                body = body[1:]  # the docstring does not count
            if not body:
                continue
            n = body[-1].end_lineno - body[0].lineno + 1
            if n > MAX_FUNCTION_LINES and (path.name, node.name) not in LONG_FUNCTIONS:
                too_long.append((str(path.relative_to(PKG)), node.name, n))
    assert not too_long, f"over the size limits (see docs/architecture.rst): {too_long}"
