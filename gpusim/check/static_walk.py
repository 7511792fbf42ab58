"""The statement walker behind gpusim.check.static_races: a phase's source (and its jit
helpers', their parameters bound to the caller's arguments) read for the state-array
entries it writes and reads, each with whether its index depends on the agent, and
whether a single-agent guard or an atomic covers it.
"""
from __future__ import annotations

import ast
import inspect
import os
import textwrap
from dataclasses import dataclass

from gpusim.kernels import is_jit

_MAX_DEPTH = 8  # helper calls followed
_PARSED = {}  # py_func -> (its FunctionDef with file line numbers, file name), or None


class _Unknown(Exception):
    pass


def parsed(fn):
    """(FunctionDef, file) of jit or plain function `fn`, cached; None where no source."""
    py = getattr(fn, "py_func", fn)
    if py not in _PARSED:
        try:
            lines, first = inspect.getsourcelines(py)
            tree = ast.parse(textwrap.dedent("".join(lines)))
            ast.increment_lineno(tree, first - 1)
            node = next(n for n in tree.body if isinstance(n, ast.FunctionDef))
            _PARSED[py] = (node, os.path.basename(inspect.getsourcefile(py) or "?"))
        except (OSError, TypeError, SyntaxError, StopIteration):
            _PARSED[py] = None
    return _PARSED[py]


@dataclass(frozen=True)
class Value:
    """What the check knows of a name: agent-dependent, the agent itself, the state tuple,
    the parameter tuple, or an array (a view of one: `prefix_dep` for its leading index)."""
    dep: bool = False
    agent: bool = False
    state: bool = False
    params: bool = False
    array: str | None = None


@dataclass(frozen=True)
class _Access:
    array: str
    index: str
    dep: bool
    where: str
    guarded: bool = False
    atomic: bool = False
    update: bool = False


class Scan:
    """Walks a phase and its helpers, collecting array writes and reads."""

    def __init__(self, params):
        self.params = params
        self.writes, self.reads = [], []
        self._done = set()

    def function(self, fn, bound, guarded, depth):
        got = parsed(fn)
        if got is None or depth > _MAX_DEPTH:
            return
        key = (getattr(fn, "py_func", fn), tuple(sorted(bound.items())), guarded)
        if key in self._done:
            return
        self._done.add(key)
        node, file = got
        names = dict(bound)
        _dataflow(node, names)
        body = _Body(self, getattr(fn, "py_func", fn).__globals__, file, names, depth)
        body.locals = {a.arg for a in node.args.args} | {
            n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        body.block(node.body, guarded)


def _dataflow(node, names):
    """Give every local assigned from an agent-dependent expression (or an array view)
    its value, to a fixpoint, ignoring order: a doubt counts as dependent."""
    changed = True
    while changed:
        changed = False
        for stmt in ast.walk(node):
            if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                value = stmt.value
            elif isinstance(stmt, ast.For):
                targets, value = [stmt.target], stmt.iter
            else:
                continue
            if value is None:
                continue
            got = _value_of(value, names)
            for target in targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store):
                        old = names.get(t.id, Value())
                        new = Value(dep=old.dep or got.dep, array=old.array or got.array)
                        if isinstance(stmt, ast.Assign) and len(targets) == 1 \
                                and isinstance(target, ast.Name):
                            new = Value(dep=new.dep, state=got.state or old.state,
                                         params=got.params or old.params, array=new.array)
                        if new != old and not old.agent:
                            names[t.id] = new
                            changed = True


def _value_of(expr, names) -> Value:
    dep = any(isinstance(n, ast.Name) and (names.get(n.id, Value()).dep)
              for n in ast.walk(expr))
    if isinstance(expr, ast.Name):
        got = names.get(expr.id, Value())
        return Value(dep=got.dep, agent=got.agent, state=got.state, params=got.params,
                      array=got.array)
    array = _array_name(expr, names)
    return Value(dep=dep, array=array)


def _array_name(expr, names):
    """The state array `expr` is (or a view of), or None."""
    while isinstance(expr, ast.Subscript):
        expr = expr.value
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) \
            and names.get(expr.value.id, Value()).state:
        return expr.attr
    if isinstance(expr, ast.Name):
        return names.get(expr.id, Value()).array
    return None


def _depends(expr, names) -> bool:
    return any(isinstance(n, ast.Name) and names.get(n.id, Value()).dep
               for n in ast.walk(expr))


def _attribute_path(expr):
    parts = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    return parts if isinstance(expr, ast.Name) else None



_MIRROR = {ast.Lt: ast.Gt, ast.Gt: ast.Lt, ast.LtE: ast.GtE, ast.GtE: ast.LtE,
           ast.Eq: ast.Eq, ast.NotEq: ast.NotEq}
_EXITS = (ast.Return, ast.Continue, ast.Break, ast.Raise)
_CONSTANTS = (bool, int, float)


class _Body:
    """One function's statements, in order: which accesses run under a single-agent guard."""

    def __init__(self, scan, globs, file, names, depth):
        self.scan, self.globs, self.file, self.names, self.depth = scan, globs, file, names, depth
        self.locals = set(names)  # every name the function binds (set by the caller)

    def block(self, stmts, guarded):
        for stmt in stmts:
            guarded = self.statement(stmt, guarded)

    def statement(self, stmt, guarded) -> bool:
        """Walk `stmt`; whether the statements after it run under a single-agent guard."""
        if isinstance(stmt, ast.If):
            known = self.evaluate(stmt.test)
            if known is not None:
                self.block(stmt.body if known else stmt.orelse, guarded)
                return guarded
            self.expr(stmt.test, guarded)
            saved, one = self.names, self.selects_one(stmt.test, False)
            self.names = self._equal_to_agent(stmt.test)
            self.block(stmt.body, guarded or one)
            self.names = saved
            otherwise = guarded or self.selects_one(stmt.test, True)
            self.block(stmt.orelse, otherwise)
            if stmt.body and isinstance(stmt.body[-1], _EXITS) and not stmt.orelse:
                return otherwise  # `if agent != 0: return`: the rest is agent 0's
            return guarded
        if isinstance(stmt, (ast.For, ast.While)):
            self.expr(stmt.iter if isinstance(stmt, ast.For) else stmt.test, guarded)
            self.block(stmt.body, guarded)
            self.block(stmt.orelse, guarded)
        elif isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            if stmt.value is not None:
                self.expr(stmt.value, guarded)
            for target in targets:
                for t in (target.elts if isinstance(target, ast.Tuple) else [target]):
                    if isinstance(t, ast.Subscript):
                        update = isinstance(stmt, ast.AugAssign) or (
                            stmt.value is not None and any(
                                isinstance(n, ast.Subscript) and ast.dump(n.value) == ast.dump(
                                    t.value) for n in ast.walk(stmt.value)))
                        self.access(t, guarded, write=True, update=update)
                        self.expr(t.slice, guarded)
        elif isinstance(stmt, (ast.With, ast.Try)):
            for part in ("body", "orelse", "finalbody"):
                self.block(getattr(stmt, part, []), guarded)
            for handler in getattr(stmt, "handlers", []):
                self.block(handler.body, guarded)
        else:
            for child in ast.iter_child_nodes(stmt):
                if isinstance(child, ast.expr):
                    self.expr(child, guarded)
        return guarded

    # ---- expressions -------------------------------------------------------------------
    def expr(self, node, guarded):
        if isinstance(node, ast.Subscript):
            if self.access(node, guarded, write=False):
                self.expr(node.slice, guarded)
                return
        elif isinstance(node, ast.Call):
            if self.call(node, guarded):
                return
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self.expr(child, guarded)

    def access(self, node, guarded, write, update=False, atomic=False) -> bool:
        """Record a read or write of a state array's entry; False if `node` is none."""
        array = _array_name(node, self.names)
        if array is None:
            return False
        base = node
        while isinstance(base.value, ast.Subscript):
            base = base.value
        view = self.names.get(base.value.id, Value()) if isinstance(base.value, ast.Name) \
            else Value()
        index = ", ".join(ast.unparse(s) for s in _indices(node))
        dep = view.dep or any(_depends(s, self.names) for s in _indices(node))
        found = _Access(array, index, dep, f"{self.file}:{node.lineno}", guarded, atomic,
                        update)
        (self.scan.writes if write else self.scan.reads).append(found)
        if update and write:
            self.scan.reads.append(found)
        return True

    def call(self, node, guarded) -> bool:
        """A helper followed, or an atomic recorded; False for any other call."""
        path = _attribute_path(node.func)
        if path and "atomic" in path and node.args:  # cuda.atomic.add(array, index, value)
            target = node.args[0]
            array = _array_name(target, self.names)
            if array is not None:
                index = node.args[1] if len(node.args) > 1 else None
                dep = self.names.get(getattr(target, "id", ""), Value()).dep or (
                    index is not None and _depends(index, self.names))
                self.scan.writes.append(_Access(array, ast.unparse(index) if index else "",
                                                dep, f"{self.file}:{node.lineno}", guarded,
                                                True, True))
                for arg in node.args[1:]:
                    self.expr(arg, guarded)
                return True
        fn = self.resolve(node.func)
        if fn is None or not is_jit(fn):
            return False
        got = parsed(fn)
        if got is None:
            return False
        params = [a.arg for a in got[0].args.args]
        bound = {}
        for name, arg in list(zip(params, node.args)) + [
                (k.arg, k.value) for k in node.keywords if k.arg in params]:
            bound[name] = _value_of(arg, self.names)
            if not isinstance(arg, ast.Subscript) or _array_name(arg, self.names) is None:
                self.expr(arg, guarded)  # a view passed on is read where the helper reads
        self.scan.function(fn, bound, guarded, self.depth + 1)
        return True

    def resolve(self, func):
        if isinstance(func, ast.Name):
            return None if func.id in self.locals else self.globs.get(func.id)
        path = _attribute_path(func)
        if not path:
            return None
        root = func
        while isinstance(root, ast.Attribute):
            root = root.value
        value = self.globs.get(root.id)
        for attr in reversed(path):
            value = getattr(value, attr, None)
        return value

    # ---- conditions --------------------------------------------------------------------
    def evaluate(self, test):
        """The value of a condition made of the env's parameters and constants, or None."""
        try:
            return bool(self.constant(test))
        except (_Unknown, ArithmeticError, TypeError, ValueError):
            return None

    def constant(self, node):
        if isinstance(node, ast.Constant) and isinstance(node.value, _CONSTANTS):
            return node.value
        if isinstance(node, ast.Name) and node.id not in self.locals \
                and isinstance(self.globs.get(node.id), _CONSTANTS):
            return self.globs[node.id]
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and self.names.get(node.value.id, Value()).params \
                and self.scan.params is not None:
            value = getattr(self.scan.params, node.attr, None)
            value = value.item() if hasattr(value, "item") else value
            if isinstance(value, _CONSTANTS):
                return value
        if isinstance(node, ast.UnaryOp):
            value = self.constant(node.operand)
            ops = {ast.Not: lambda v: not v, ast.USub: lambda v: -v, ast.UAdd: lambda v: v}
            if type(node.op) in ops:
                return ops[type(node.op)](value)
        if isinstance(node, ast.BoolOp):
            values = [self.constant(v) for v in node.values]
            return all(values) if isinstance(node.op, ast.And) else any(values)
        if isinstance(node, ast.BinOp):
            ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
                   ast.Mult: lambda a, b: a * b, ast.FloorDiv: lambda a, b: a // b,
                   ast.Mod: lambda a, b: a % b}
            if type(node.op) in ops:
                return ops[type(node.op)](self.constant(node.left), self.constant(node.right))
        if isinstance(node, ast.Compare):
            ops = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b,
                   ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b,
                   ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b}
            left = self.constant(node.left)
            for op, right in zip(node.ops, node.comparators):
                right = self.constant(right)
                if type(op) not in ops or not ops[type(op)](left, right):
                    return False
                left = right
            return True
        raise _Unknown

    def selects_one(self, test, negated) -> bool:
        """Whether `test` (or, `negated`, its negation) holds for one agent at most."""
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return self.selects_one(test.operand, not negated)
        if isinstance(test, ast.BoolOp):
            if isinstance(test.op, ast.And) != negated:  # a conjunction
                return any(self.selects_one(v, negated) for v in test.values)
            return all(self.selects_one(v, negated) for v in test.values)
        if not isinstance(test, ast.Compare) or len(test.ops) != 1:
            return False
        left, op, right = test.left, type(test.ops[0]), test.comparators[0]
        if self._is_agent(right) and not self._is_agent(left):
            left, right, op = right, left, _MIRROR.get(op)
        if not self._is_agent(left) or _depends(right, self.names):
            return False
        if (op, negated) in ((ast.Eq, False), (ast.NotEq, True)):
            return True
        try:  # agent < 1, agent <= 0, not agent > 0, not agent >= 1: agent 0 alone
            bound = self.constant(right)
        except _Unknown:
            return False
        return (op, negated) in (((ast.Lt, False), (ast.GtE, True)) if bound == 1 else
                                 ((ast.LtE, False), (ast.Gt, True)) if bound == 0 else ())

    def _is_agent(self, node):
        return isinstance(node, ast.Name) and self.names.get(node.id, Value()).agent

    def _equal_to_agent(self, test):
        """The names with `k` counted as the agent, inside `if k == agent:`."""
        if isinstance(test, ast.Compare) and len(test.ops) == 1 \
                and isinstance(test.ops[0], ast.Eq):
            pair = (test.left, test.comparators[0])
            for a, b in (pair, pair[::-1]):
                if self._is_agent(a) and isinstance(b, ast.Name):
                    return {**self.names, b.id: Value(dep=True, agent=True)}
        return self.names


def _indices(node):
    """The index expressions of a (possibly chained) subscript, outermost array first."""
    parts = []
    while isinstance(node, ast.Subscript):
        s = node.slice
        parts[:0] = list(s.elts) if isinstance(s, ast.Tuple) else [s]
        node = node.value
    return parts
