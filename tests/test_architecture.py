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
- A participant's calls into the parameter server go through one typed
  interface: the estimators call nothing on their ``ctx`` beyond
  ``dask_ps.ParticipantContext``, which ``Session`` implements.
- The scheduler's parts are handed what they use: ``PlacementChanger``,
  ``HungWorkers`` and ``LostReports`` never hold the scheduler plugin; on
  the worker, ``Session`` holds its in-flight part (``InFlight``) as a
  member handed what it uses, never the session.
- No module over 900 lines and no function over 80 lines (docstring not
  counted), except the compiled kernels listed in ``LONG_FUNCTIONS``.
"""

from __future__ import annotations

import ast
import inspect
import pathlib
import textwrap

import dask_ps
from dask_ps import ParticipantContext, Session

PKG = pathlib.Path(dask_ps.__file__).parent

PURE_CORE = {
    "_backend", "_config", "_exceptions", "_spec", "_routing", "_oplog", "_shard", "_sums", "_holds", "_placement",
    "rules", "consistency", "_sparse_rows", "_compiled", "_row_lists",
}


def _parse(text):
    """``ast.parse``, tried again on CPython 3.11's spurious ``SystemError:
    AST constructor recursion depth mismatch`` (python/cpython#106905, fixed
    after 3.11.7): the AST state's depth counter is shared with other threads
    (the cluster tests' leftover threads), and parsing the same text again
    is exact."""
    for _ in range(4):
        try:
            return ast.parse(text)
        except SystemError as e:
            if "recursion depth mismatch" not in str(e):
                raise
    return ast.parse(text)


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
    for node in ast.walk(_parse(path.read_text())):
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
            for node in ast.walk(_parse(path.read_text())):
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
        for node in ast.walk(_parse(text)):
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


# --- the participant's interface (issue 36: estimators type against a protocol) ---------------------


def _protocol_members() -> tuple[set[str], set[str]]:
    """``(methods and properties, data attributes)`` of ``ParticipantContext``."""
    methods = {n for n, v in vars(ParticipantContext).items()
               if not n.startswith("_") and (callable(v) or isinstance(v, property))}
    return methods, set(ParticipantContext.__annotations__)


def _assigned_on_self(cls) -> set[str]:
    """Attributes assigned as ``self.x = ...`` in ``cls`` and its bases."""
    out = set()
    for klass in cls.__mro__[:-1]:
        tree = _parse(textwrap.dedent(inspect.getsource(klass)))
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
            for t in targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    out.add(t.attr)
    return out


def test_the_session_implements_the_participant_context():
    """Every member of ``ParticipantContext`` is on ``Session``, methods with
    the same parameters and defaults (a structural check: building a
    ``Session`` needs a worker)."""
    methods, data = _protocol_members()
    assert {"push", "push_rows", "pull", "pull_rows", "prefetch", "prefetch_rows", "flush", "clock",
            "current_clock", "metrics"} <= methods
    wrong = []
    for name in sorted(methods):
        want, have = getattr(ParticipantContext, name), getattr(Session, name, None)
        if isinstance(want, property):
            if not isinstance(have, property):
                wrong.append((name, "not a property"))
            continue
        if not callable(have):
            wrong.append((name, "missing"))
            continue
        params = [(p.name, p.kind, p.default) for p in inspect.signature(want).parameters.values()]
        got = [(p.name, p.kind, p.default) for p in inspect.signature(have).parameters.values()]
        if params != got:
            wrong.append((name, got, "expected", params))
    missing = data - _assigned_on_self(Session)
    assert not wrong and not missing, f"Session does not implement ParticipantContext: {wrong} {sorted(missing)}"


def _context_calls(tree: ast.AST) -> list[tuple[int, str, bool]]:
    """``(line, attribute, on_the_inner_context)`` of every attribute read on
    a participant's context: a parameter named ``ctx`` or annotated
    ``ParticipantContext``, ``self.ctx``, and the inner context of a wrapper
    (``._ctx``); ``getattr``/``hasattr`` with a constant name count too."""
    names = {"ctx"}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for a in node.args.args + node.args.kwonlyargs:
                if a.annotation is not None and "ParticipantContext" in ast.unparse(a.annotation):
                    names.add(a.arg)

    def kind(e) -> str | None:
        if isinstance(e, ast.Name) and e.id in names:
            return "ctx"
        if isinstance(e, ast.Attribute) and e.attr == "ctx" and isinstance(e.value, ast.Name) and e.value.id == "self":
            return "ctx"
        if isinstance(e, ast.Attribute) and e.attr == "_ctx" and (kind(e.value) or isinstance(e.value, ast.Name)
                                                                  and e.value.id == "self"):
            return "inner"
        return None

    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and kind(node.value) and node.attr not in ("ctx", "_ctx"):
            out.append((node.lineno, node.attr, kind(node.value) == "inner"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and len(node.args) >= 2 and kind(node.args[0]) and isinstance(node.args[1], ast.Constant)):
            out.append((node.lineno, node.args[1].value, kind(node.args[0]) == "inner"))
    return out


def _timing_wrapper_members() -> set[str]:
    """The SGD participant's ``_TimedCtx`` (times the calls, passes the rest through)."""
    tree = _parse((PKG / "linear_model" / "_participant.py").read_text())
    [cls] = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "_TimedCtx"]
    return {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))} | {
        t.attr for n in ast.walk(cls) if isinstance(n, (ast.Assign, ast.AnnAssign))
        for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Attribute)}


def test_estimators_call_nothing_beyond_the_participant_context():
    """What a participant of an estimator reads on its ``ctx`` is in
    ``ParticipantContext`` (or the SGD participant's own timing wrapper,
    whose inner context is held to the protocol alone): no session
    internals, so the session can change without touching them."""
    methods, data = _protocol_members()
    allowed = methods | data
    wrapper = _timing_wrapper_members()
    assert {"pull", "clock", "overlaps"} <= wrapper
    offenders = []
    for pkg in (*ESTIMATOR_PACKAGES, SHARED_ESTIMATOR_PACKAGE):
        for path in _modules(PKG / pkg):
            for line, attr, inner in _context_calls(_parse(path.read_text())):
                if attr not in allowed and (inner or attr not in wrapper):
                    offenders.append((f"{pkg}/{path.name}:{line}", attr))
    assert not offenders, f"estimators reach past ParticipantContext: {offenders}"
    # The check sees what it is for: a session internal, directly or through a wrapper.
    probe = _parse("def f(ctx: ParticipantContext):\n    ctx._sync(1)\n    getattr(ctx._ctx, '_router')\n")
    assert sorted((a, inner) for _, a, inner in _context_calls(probe)) == [("_router", True), ("_sync", False)]


def test_scheduler_parts_are_handed_what_they_use():
    """``PlacementChanger``, ``HungWorkers`` and ``LostReports`` take their
    collaborators (tables, membership, liveness, calls, actions), never
    the scheduler plugin: nothing in them names a ``plugin``."""
    parts = {"_rebalance.py": "PlacementChanger", "_liveness.py": "HungWorkers", "_lost_report.py": "LostReports"}
    offenders = []
    for module, name in parts.items():
        tree = _parse((PKG / module).read_text())
        [cls] = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name]
        for node in ast.walk(cls):
            if (isinstance(node, ast.Name) and "plugin" in node.id
                    or isinstance(node, ast.Attribute) and "plugin" in node.attr
                    or isinstance(node, ast.arg) and "plugin" in node.arg):
                offenders.append((name, node.lineno))
    assert not offenders, f"scheduler parts that reach back into the plugin: {offenders}"


def test_the_session_holds_its_in_flight_part_as_a_member():
    """``InFlight`` is a member of ``Session`` (``_in_flight``), handed its
    collaborators, not a base class that reaches into the session: the
    session is not an ``InFlight``, and nothing in ``InFlight`` or
    ``ClockReports`` names a ``session`` (the loop calls it is handed are
    named for what they do)."""
    from dask_ps._flights import InFlight
    from dask_ps._participant_state import ClockReports

    assert not issubclass(Session, InFlight)
    assert "_in_flight" in _assigned_on_self(Session)
    offenders = []
    for module, name in {"_flights.py": "InFlight", "_participant_state.py": "ClockReports"}.items():
        tree = _parse((PKG / module).read_text())
        [cls] = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name]
        for node in ast.walk(cls):
            if (isinstance(node, ast.Name) and "session" in node.id.lower()
                    or isinstance(node, ast.Attribute) and "session" in node.attr.lower()
                    or isinstance(node, ast.arg) and "session" in node.arg.lower()):
                offenders.append((name, node.lineno))
    assert not offenders, f"the in-flight part reaches back into the session: {offenders}"
