"""How a repro runs: load its inputs, compile its graph the way it failed, run, compare, and say
whether the recorded failure reproduced (with the exit code).

This module needs only torch (and tdbg only for tdbg's own backends), because `repro.py` carries
its source verbatim: a repro of a `torch:*` backend can be attached to a PyTorch bug report as
is. tdbg's minifier compiles every query through `compile_graph` and `evaluate` too, so the
minifier and repro.py judge a graph the same way.

A spec (the data a repro file holds):
  after     "dynamo" (the graph Dynamo made, given to the backend) or "aot" (an aten graph after
            AOTAutograd, given to the backend's own per-graph compiler)
  backend   {"kind": "named", "name": "inductor"|"aot_eager"|"eager"|"torch:NAME"}
            {"kind": "import", "module": M, "attr": A, "files": [relative paths copied beside
             the repro], "root": folder to import from (in memory only; the repro's own folder)}
            {"kind": "source", "name": N, "source": S} (a function from the script itself)
  aot       {"family": "tdbg"|"torch:inductor"|"aot_autograd", "graph": "forward"|"backward"|"inference"}
  config, check_accuracy, tolerance, ignore_non_fp
  dynamic   {input name: the symbols its sizes had when it failed}: a tensor's, one entry per dim
            (the size's symbolic expression as text, e.g. "s77", or None where static); an int
            input's, a 1-tuple. Those dims compile symbolic again (`symbolic_inputs`), so a backend
            sees the graph with symbolic shapes as it did, not one specialized to these sizes
Outcomes are dicts: kind (pass, invalid, cannot_run, compile_error, runtime_error, accuracy,
crash, hang), exc_type, message, pattern, stage, outputs, signal, mismatches.
"""
import ast
import contextlib
import hashlib
import importlib
import json
import linecache
import operator
import os
import re
import signal as signal_module
import subprocess
import sys
import time

import torch
import torch.fx

FAILURE_KINDS = ("compile_error", "runtime_error", "accuracy", "crash", "hang", "out_of_memory")
# exit codes (tdbg's table, `tdbg --help`): a stage's own code, else the outcome kind's
EXIT_CODES = {"ok": 0, "bad_input": 3, "dynamo": 10, "aot_autograd": 11, "lowering": 12, "scheduling": 13,
              "cpp_build": 14, "kernel_runtime": 15, "accuracy": 16, "crash": 17, "timeout": 18,
              "backend": 19, "not_reproduced": 21}
KIND_EXITS = {"accuracy": "accuracy", "crash": "crash", "hang": "timeout", "out_of_memory": "crash",
              "compile_error": "backend", "runtime_error": "backend", "invalid": "bad_input",
              "cannot_run": "bad_input"}
AOT_COMPILER_KEYS = {"forward": "fw_compiler", "backward": "bw_compiler", "inference": "inference_compiler"}


class CannotRun(Exception):
    """The repro cannot be run here (its backend does not import, an input file is missing)."""


# ---------------------------------------------------------------- inputs

def load_inputs(rows, folder):
    """The forward() arguments from INPUTS rows (tensors read from inputs/<sha256>.bin)."""
    values = []
    for name, sha, shape, stride, dtype, requires_grad, value in rows:
        if not dtype:
            values.append(value)
            continue
        path = os.path.join(folder, "inputs", f"{sha}.bin")
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise CannotRun(f"input {name}: cannot read {path}: {e.strerror}") from None
        if hashlib.sha256(data).hexdigest() != sha:
            raise CannotRun(f"input {name}: {path} does not match its SHA-256 name (the file was changed)")
        kind = getattr(torch, dtype)
        flat = torch.frombuffer(bytearray(data), dtype=kind).clone() if data else torch.empty(0, dtype=kind)
        t = with_strides(flat.reshape(shape), stride)
        values.append(t.requires_grad_(True) if requires_grad and t.is_floating_point() else t)
    return values



def with_strides(t, stride):
    """`t` (contiguous) laid out with `stride`. Dims of stride 0 (an expanded tensor: its elements
    share memory, so nothing can be copied into that layout) are rebuilt by expanding one slice."""
    stride = tuple(stride)
    if not stride or tuple(t.stride()) == stride or t.numel() == 0:
        return t
    expanded = [d for d, (n, s) in enumerate(zip(t.shape, stride)) if s == 0 and n > 1]
    if expanded:
        base = t[tuple(slice(0, 1) if d in expanded else slice(None) for d in range(t.dim()))]
        return with_strides(base.contiguous(), stride).expand(t.shape)
    return torch.empty_strided(tuple(t.shape), stride, dtype=t.dtype).copy_(t)

def fresh(inputs):
    """Copies of the inputs, so no run sees another's in-place changes."""
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            y = x.detach().clone()
            out.append(y.requires_grad_(True) if x.requires_grad else y)
        else:
            out.append(x)
    return out


# ---------------------------------------------------------------- the graph

class GraphSourceError(ValueError):
    """A graph's source holds a statement that is not one FX writes (line, text and why)."""


# Python syntax FX's code generator writes for `operator` calls -> the operator
BINARY_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
              ast.LShift: operator.lshift, ast.RShift: operator.rshift, ast.BitAnd: operator.and_,
              ast.BitOr: operator.or_, ast.BitXor: operator.xor, ast.MatMult: operator.matmul}
UNARY_OPS = {ast.UAdd: operator.pos, ast.USub: operator.neg, ast.Invert: operator.invert}
COMPARE_OPS = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.Gt: operator.gt,
               ast.LtE: operator.le, ast.GtE: operator.ge}
INPLACE_OPS = {ast.Add: operator.iadd, ast.Sub: operator.isub, ast.Mult: operator.imul,
               ast.Div: operator.itruediv, ast.FloorDiv: operator.ifloordiv, ast.Mod: operator.imod,
               ast.Pow: operator.ipow, ast.LShift: operator.ilshift, ast.RShift: operator.irshift,
               ast.BitAnd: operator.iand, ast.BitOr: operator.ior, ast.BitXor: operator.ixor,
               ast.MatMult: operator.imatmul}


def trace_repro(module):
    """`module` (an instance of a repro's `Repro` class) as the GraphModule the minifier ran.

    The graph is READ from the class's source, not traced by running it: every statement of an
    FX-written `forward` is one node (`y = torch.sin(x)`, `y = x.view(2, 3)`, `y = x + 1`,
    `x[0] = y;  setitem = x`, `y += 1;  iadd = y`, `sub = self.sub`), its target evaluated in the
    file's globals. Nothing runs, so calls no tracer can see through (functorch's
    `_add_batch_dim`, `torch._C` functions taking tensors only), writes into views, factory calls
    without tensor arguments (kept as nodes, not folded into constants) and higher-order ops (the
    `self.NAME` bodies, classes of the same file set in `__init__`, become GraphModules) all come
    back as the same nodes with the same targets. GraphSourceError names a statement FX does not
    write."""
    cls = type(module)
    forward = cls.forward
    filename = forward.__code__.co_filename
    text = "".join(linecache.getlines(filename, forward.__globals__))
    if not text:
        raise GraphSourceError(f"the source of {cls.__name__} ({filename}) cannot be read")
    tree = ast.parse(text, filename)
    classes = {c.name: c for c in tree.body if isinstance(c, ast.ClassDef)}
    return _GraphReader(classes, forward.__globals__, filename, text).module(cls.__name__, module)


# torch modules whose import registers ops that graphs hold but `import torch` does not define:
# Inductor's decompositions put prims.fma in backward graphs (softmax's), its random passes
# inductor_prims.*. Imported the first time a graph names a torch.ops op that is missing.
OP_REGISTRARS = ("torch._inductor.inductor_prims",)
_registrars_imported = []


def register_more_ops():
    """Import OP_REGISTRARS once; whether that was new (a missing op may be defined now)."""
    if _registrars_imported:
        return False
    _registrars_imported.append(True)
    for name in OP_REGISTRARS:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    return True


class _GraphReader:
    def __init__(self, classes, namespace, filename, text):
        self.classes, self.namespace, self.filename = classes, namespace, filename
        self.lines = text.splitlines()

    def module(self, name, instance=None):
        """The GraphModule of class `name`: its forward read as a graph; attributes that are
        instances of classes of the same source are read the same way (higher-order op bodies)."""
        cdef = self.classes.get(name)
        forward = next((f for f in (cdef.body if cdef else ()) if isinstance(f, ast.FunctionDef)
                        and f.name == "forward"), None)
        if forward is None:
            raise GraphSourceError(f"{self.filename}: no class {name} with a forward() in the graph's source")
        root = instance if instance is not None else self.namespace[name]()
        for attr, value in list(vars(root).get("_modules", {}).items()):
            if type(value).__name__ in self.classes and type(value).__module__ == root.__module__:
                setattr(root, attr, self.module(type(value).__name__, value))
        graph = torch.fx.Graph()
        env = {}
        args = forward.args.args[1:]
        defaults = [None] * (len(args) - len(forward.args.defaults)) + list(forward.args.defaults)
        if forward.args.vararg or forward.args.kwonlyargs or forward.args.kwarg:
            raise GraphSourceError(f"{self.filename}:{forward.lineno}: {name}.forward takes *args, keyword-only "
                                   "or **kwargs arguments, which FX graphs of tdbg never have")
        body = [s for s in forward.body if not self._ignored(s)]
        renamed = self._placeholder_names(body, {a.arg for a in args})
        for arg, default in zip(args, defaults):
            # a default value is the placeholder's one argument (as FX's placeholder(default_value=))
            defaults_arg = (self.value(default, env),) if default is not None else ()
            env[arg.arg] = graph.create_node("placeholder", arg.arg, defaults_arg, name=renamed.get(arg.arg, arg.arg))
        i = 0
        while i < len(body):
            i = self.statement(graph, env, body, i, root)
        graph.lint()
        return torch.fx.GraphModule(root, graph)

    @staticmethod
    def _placeholder_names(body, args):
        """A placeholder whose name is not its target is written `NAME = TARGET` before any other
        statement (a higher-order op body's `l_x__1 = l_x_`): argument -> node name."""
        names = {}
        for stmt in body:
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                    and isinstance(stmt.value, ast.Name) and stmt.value.id in args - set(names)):
                break
            names[stmt.value.id] = stmt.targets[0].id
        return names

    @staticmethod
    def _ignored(stmt):
        """Docstrings, `pass`, and FX's `a = b = None` (freeing values early)."""
        if isinstance(stmt, ast.Pass) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
            return True
        return (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant) and stmt.value.value is None
                and all(isinstance(t, ast.Name) for t in stmt.targets))

    def fail(self, stmt, why):
        line = self.lines[stmt.lineno - 1].strip() if 0 < stmt.lineno <= len(self.lines) else "?"
        raise GraphSourceError(f"{self.filename}:{stmt.lineno}: `{line}`: {why}")

    def value(self, expr, env, stmt=None):
        """An argument: Python values, with names of earlier statements as their nodes. The forms
        FX writes most (constants, names, tuples, lists, `torch.ops.aten.add.Tensor`) are read
        directly (a 1000-node graph in ~0.1 s); anything else is evaluated."""
        kind = type(expr)
        if kind is ast.Constant:
            return expr.value
        if kind is ast.Name and (expr.id in env or expr.id in self.namespace):
            return env[expr.id] if expr.id in env else self.namespace[expr.id]
        if kind is ast.Tuple or kind is ast.List:
            items = [self.value(e, env, stmt) for e in expr.elts]
            return tuple(items) if kind is ast.Tuple else items
        if kind is ast.Attribute and type(expr.value) in (ast.Name, ast.Attribute):
            base = self.value(expr.value, env, stmt)
            if not isinstance(base, torch.fx.Node) and hasattr(base, expr.attr):
                return getattr(base, expr.attr)
        if kind is ast.Slice:     # `x[1:3]` as a person writes it (FX writes slice(1, 3, None))
            return slice(*(None if e is None else self.value(e, env, stmt) for e in (expr.lower, expr.upper, expr.step)))
        try:
            return eval(compile(ast.Expression(expr), self.filename, "eval"), self.namespace, env)
        except Exception as e:
            if ast.unparse(expr).startswith("torch.ops.") and register_more_ops():
                return self.value(expr, env, stmt)
            self.fail(stmt or expr, f"cannot evaluate `{ast.unparse(expr)}`: {type(e).__name__}: {e}")

    def _name_of_next(self, body, i, base):
        """FX follows an in-place statement with `NAME = BASE` (the node's name): NAME, or None."""
        nxt = body[i + 1] if i + 1 < len(body) else None
        if (isinstance(nxt, ast.Assign) and len(nxt.targets) == 1 and isinstance(nxt.targets[0], ast.Name)
                and isinstance(nxt.value, ast.Name) and nxt.value.id == base):
            return nxt.targets[0].id
        return None

    def statement(self, graph, env, body, i, root):
        """Add the node(s) of body[i]; the index of the next statement to read."""
        stmt = body[i]
        if isinstance(stmt, ast.Return):
            graph.output(self.value(stmt.value, env, stmt) if stmt.value is not None else None)
            return i + 1
        if isinstance(stmt, ast.AugAssign) and type(stmt.op) in INPLACE_OPS and isinstance(stmt.target, ast.Name):
            base = stmt.target.id
            name = self._name_of_next(body, i, base)
            if base not in env:
                self.fail(stmt, f"writes into {base}, which no earlier statement made")
            node = graph.create_node("call_function", INPLACE_OPS[type(stmt.op)],
                                     (env[base], self.value(stmt.value, env, stmt)), name=name)
            env[base] = node   # as Python rebinds `base += v`
            if name:
                env[name] = node
            return i + (2 if name else 1)
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Subscript):
            sub = stmt.targets[0]
            base = sub.value.id if isinstance(sub.value, ast.Name) else None
            name = self._name_of_next(body, i, base) if base else None
            graph.create_node("call_function", operator.setitem, (
                self.value(sub.value, env, stmt), self.value(sub.slice, env, stmt), self.value(stmt.value, env, stmt)),
                name=name)
            if name:
                env[name] = env[base]   # FX binds the name to the written tensor
            return i + (2 if name else 1)
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            if len(targets) != 1 or not isinstance(targets[0], ast.Name) or stmt.value is None:
                self.fail(stmt, "an assignment FX does not write (one name = one call or operator)")
            name = targets[0].id
            env[name] = self.expression(graph, env, stmt.value, name, stmt, root)
            return i + 1
        self.fail(stmt, f"a {type(stmt).__name__} statement, which FX graphs do not contain")

    def expression(self, graph, env, expr, name, stmt, root):
        """The node of `name = expr` (one call, attribute, operator or alias, as FX writes them)."""
        val = lambda e: self.value(e, env, stmt)   # noqa: E731
        call = lambda target, args, kwargs=None: graph.create_node(   # noqa: E731
            "call_function", target, args, kwargs or {}, name=name)
        if isinstance(expr, ast.Name) and expr.id in env:
            return env[expr.id]                     # `l_x_ = L_x_`, `iadd = getitem`: an alias
        if isinstance(expr, ast.Call):
            func = expr.func
            kwargs = {k.arg: val(k.value) for k in expr.keywords if k.arg}
            if len(kwargs) != len(expr.keywords) or any(isinstance(a, ast.Starred) for a in expr.args):
                self.fail(stmt, "a call with * or ** arguments")
            args = tuple(val(a) for a in expr.args)
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                if func.value.id in env:
                    return graph.create_node("call_method", func.attr, (env[func.value.id],) + args, kwargs, name=name)
                if func.value.id == "self":
                    self.fail(stmt, f"calls submodule self.{func.attr}; tdbg's graphs are functional "
                                    "(Dynamo inlines nn.Modules)")
            return call(val(func), args, kwargs)
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            if expr.value.id == "self":
                if not hasattr(root, expr.attr):
                    self.fail(stmt, f"reads self.{expr.attr}, which the module does not have")
                return graph.create_node("get_attr", expr.attr, name=name)
            if expr.value.id in env:
                return call(getattr, (env[expr.value.id], expr.attr))
        if isinstance(expr, ast.BinOp) and type(expr.op) in BINARY_OPS:
            return call(BINARY_OPS[type(expr.op)], (val(expr.left), val(expr.right)))
        if isinstance(expr, ast.UnaryOp) and type(expr.op) in UNARY_OPS:
            return call(UNARY_OPS[type(expr.op)], (val(expr.operand),))
        if isinstance(expr, ast.Compare) and len(expr.ops) == 1 and type(expr.ops[0]) in COMPARE_OPS:
            return call(COMPARE_OPS[type(expr.ops[0])], (val(expr.left), val(expr.comparators[0])))
        if isinstance(expr, ast.Subscript):
            return call(operator.getitem, (val(expr.value), val(expr.slice)))
        self.fail(stmt, "not a call, attribute, operator or name, the forms FX writes")

def snapshot(gm):
    """A copy of `gm`'s graph (new nodes, same submodules and constants): what eager runs,
    whatever a backend later does to `gm` (many edit the GraphModule they are given in place:
    `node.target = my_op; gm.recompile()`; an eager reference on that edit agrees with it)."""
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    return torch.fx.GraphModule(gm, graph)


def repro_module(namespace, folder):
    """The file's `Repro()` with its CONSTANTS (rows like INPUTS) set as tensor attributes."""
    module = namespace["Repro"]()
    rows = namespace.get("CONSTANTS", [])
    for row, value in zip(rows, load_inputs(rows, folder)):
        setattr(module, row[0], value)
    return module


# ---------------------------------------------------------------- backends

def _tdbg(what):
    try:
        return importlib.import_module(what)
    except ImportError as e:
        raise CannotRun(f"this repro compiles with tdbg's own compiler, and tdbg does not import here ({e}); "
                        "install tdbg (pip install tdbg) to run it") from None


def _named(backend, spec, folder):
    name = backend["name"]
    if name.startswith("torch:"):
        import torch._dynamo
        if name[6:] not in torch._dynamo.list_backends(exclude_tags=()):
            raise CannotRun(f"Dynamo has no backend named {name[6:]!r} in this PyTorch {torch.__version__}")
        return torch._dynamo.lookup_backend(name[6:])
    return _tdbg("tdbg.minifier.runs.backends").resolve(name, tdbg_config(spec)).compiler_fn


def _imported(backend, spec, folder):
    root = backend.get("root") or folder
    if root not in sys.path:
        sys.path.insert(0, root)
    try:
        obj = importlib.import_module(backend["module"])
    except ImportError as e:
        raise CannotRun(f"the backend module {backend['module']!r} does not import from {root} ({e}); "
                        f"the repro's folder must hold {', '.join(backend.get('files') or ['it'])}") from None
    for part in backend["attr"].split("."):
        if not hasattr(obj, part):
            raise CannotRun(f"the backend module {backend['module']!r} has no {backend['attr']!r}")
        obj = getattr(obj, part)
    return obj


def _from_source(backend, spec, folder):
    namespace = {"torch": torch, "__name__": "tdbg_repro_backend"}
    exec(compile(backend["source"], f"<backend {backend['name']}>", "exec"), namespace)
    return namespace[backend["name"]]


def _unavailable(backend, spec, folder):
    raise CannotRun(f"the backend {backend.get('repr', '?')} could not be saved with the repro; "
                    "pass it to `tdbg minify --backend`")


BACKEND_KINDS = {"named": _named, "import": _imported, "source": _from_source, "unavailable": _unavailable}


def resolve_backend(spec, folder):
    """The Dynamo backend a spec names (imported from `folder` for user backends)."""
    backend = spec.get("backend") or {"kind": "named", "name": "inductor"}
    return BACKEND_KINDS[backend["kind"]](backend, spec, folder)


def tdbg_config(spec):
    """tdbg's Config for the spec: the user's TDBG_* environment with the recorded differences."""
    from_env = _tdbg("tdbg.compiler.config").from_env
    return from_env().replace(**spec.get("config", {}))


def uses_tdbg(spec):
    backend = spec.get("backend") or {"kind": "named", "name": "inductor"}
    if spec.get("after") == "aot":
        return aot_of(spec)["family"] == "tdbg" or (backend["kind"] == "named" and ":" not in backend["name"])
    return backend["kind"] == "named" and not backend["name"].startswith("torch:")


def uses_inductor(spec):
    """Whether PyTorch's Inductor compiles the graph (torch:inductor whole, or its AOT stage's compiler)."""
    backend = spec.get("backend") or {"kind": "named", "name": "inductor"}
    if spec.get("after", "aot") == "aot":
        return aot_of(spec)["family"] == "torch:inductor"
    return backend["kind"] == "named" and backend["name"] == "torch:inductor"


def aot_of(spec):
    """The AOT stage a graph was captured from (older files: tdbg's compiler, inference)."""
    return {"family": "tdbg", "graph": "inference", **(spec.get("aot") or {})}


# ---------------------------------------------------------------- compiling

def unboxed(compiled):
    """A compiled callable taking *args (AOT compilers may return ones taking one list)."""
    if getattr(compiled, "_boxed_call", False):
        return lambda *args: compiled(list(args))
    return compiled


def propagate_meta(gm, inputs):
    """node.meta["val"] (fake tensors), as AOTAutograd's graphs carry them for the compiler."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    FakeTensorProp(gm, mode).propagate(*[mode.from_tensor(x) if isinstance(x, torch.Tensor) else x
                                         for x in fresh(inputs)])


def _aot_tdbg(gm, examples, spec, folder, graph):
    compile_aten = _tdbg("tdbg.compiler").compile_aten
    # the parameters' and buffers' names (older files: none): an inference graph hoists the same work
    return compile_aten(gm, examples, tdbg_config(spec), graph_name="repro", kind=graph,
                        static_inputs=aot_of(spec).get("static_inputs") or [])


def _aot_inductor(gm, examples, spec, folder, graph):
    from torch._inductor.compile_fx import compile_fx_inner
    return unboxed(compile_fx_inner(gm, examples, is_backward=graph == "backward",
                                    is_inference=graph == "inference"))


def _aot_autograd(gm, examples, spec, folder, graph):
    backend = resolve_backend(spec, folder)
    kwargs = getattr(backend, "kwargs", None)
    if not isinstance(kwargs, dict) or "fw_compiler" not in kwargs:
        raise CannotRun(f"the backend {spec.get('backend')} is no longer an aot_autograd(...) backend")
    compiler = kwargs.get(AOT_COMPILER_KEYS[graph]) or kwargs["fw_compiler"]
    return unboxed(compiler(gm, examples))


# family -> how its per-graph compiler compiles one aten graph (what the backend does after AOT),
# given the graph (its nodes' meta["val"] set) and the example inputs AOTAutograd would pass
AOT_FAMILIES = {"tdbg": _aot_tdbg, "torch:inductor": _aot_inductor, "aot_autograd": _aot_autograd}
# the compilers that read node.meta["val"] (a static graph gets it only for them, as before)
FAMILIES_READING_META = ("tdbg", "torch:inductor")


def compile_graph(gm, inputs, spec, folder):
    """A callable(*args) running `gm` compiled the way the spec says it failed: with symbolic
    sizes where spec["dynamic"] records them (`compile_symbolic`), else on these static shapes."""
    with _inductor_scope(spec):
        return _compile_graph(gm, inputs, spec, folder)


def _inductor_scope(spec):
    """PyTorch's Inductor set as the run that made the graph set it: random ops drawing eager's
    numbers (fallback_random, recorded in the spec's config; runner._eager_random_numbers) where
    that run compared with eager. Inductor decides it while compiling."""
    if not (uses_inductor(spec) and (spec.get("config") or {}).get("fallback_random")):
        return contextlib.nullcontext()
    from torch._inductor import config as inductor_config
    return inductor_config.patch(fallback_random=True)


def _compile_graph(gm, inputs, spec, folder):
    dims = dynamic_dims(gm, spec)
    if dims:
        return compile_symbolic(gm, inputs, spec, folder, dims)
    if spec.get("after", "aot") == "aot":
        aot = aot_of(spec)
        if aot["family"] in FAMILIES_READING_META:
            propagate_meta(gm, inputs)
        return AOT_FAMILIES[aot["family"]](gm, fresh(inputs), spec, folder, aot["graph"])
    return resolve_backend(spec, folder)(gm, fresh(inputs))


# ---------------------------------------------------------------- symbolic sizes

# a placeholder's meta key holding its recorded symbols (a saved graph's, see saved_io.load_graph)
DYNAMIC_META = "tdbg_dynamic"


def dynamic_dims(gm, spec):
    """Per placeholder of `gm`, in order, its recorded symbols as a tuple (spec["dynamic"] by
    input name, else the placeholder's meta[DYNAMIC_META]) or None; [] when no input of `gm` has
    any (the graph compiles static)."""
    recorded = spec.get("dynamic") or {}
    dims = [tuple(recorded.get(n.target) or n.meta.get(DYNAMIC_META) or ()) or None
            for n in gm.graph.nodes if n.op == "placeholder"]
    return dims if any(dims) else []


def symbolic_inputs(inputs, dims):
    """(fake mode, fakes, examples) for compiling with symbolic sizes, all in one fresh ShapeEnv.

    Each recorded symbol becomes one symbol of this ShapeEnv (its size: the first dim or int
    input that has it; sizes 0 and 1 specialize, as they did when the graph was made), shared by
    every dim and int input recorded with it and by no other, even one of equal size (Dynamo's
    duck sizing merged equal sizes when the graph was made; sizes that became equal later, e.g.
    when the minifier shrank them, stay distinct). A dim or int input recorded as an expression
    of those symbols (a backward graph's `s21*s77`) is that expression of them (`_expression`);
    one recorded as an expression of symbols no input has alone (a kernel test's `2*s27`) is a
    symbol of its own (sizes 0 and 1 static); other dims are static. `fakes` are what
    AOTAutograd passes its compilers; `examples` what Dynamo passes a backend: the real tensors
    (their fakes memoized in the mode, so a backend that fakeifies them again gets the symbolic
    ones) and SymInts for the int inputs. The
    ShapeEnv names its symbols itself (e.g. s45 for a recorded s77): the same symbols, not names."""
    from torch._dynamo.source import ConstantSource, LocalSource, TensorProperty, TensorPropertySource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatefulSymbolicContext
    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env, allow_non_fake_inputs=True)
    made = {}    # recorded symbol name -> this ShapeEnv's expression for it
    for value, symbols in zip(inputs, dims):
        sizes = tuple(value.shape) if isinstance(value, torch.Tensor) else (value,)
        for recorded, size in zip(symbols or (), sizes):
            if recorded and recorded.isidentifier() and recorded not in made and type(size) is int:
                made[recorded] = env.create_symbol(size, source=ConstantSource(recorded), dynamic_dim=DimDynamic.DYNAMIC)
    fakes, examples = list(inputs), list(inputs)
    for i, (value, symbols) in enumerate(zip(inputs, dims)):
        if isinstance(value, torch.Tensor):
            source = LocalSource(f"input{i}")
            recorded = tuple(symbols or ()) + (None,) * (value.dim() - len(symbols or ()))
            cache = {}
            for k, (text, size) in enumerate(zip(recorded, value.shape)):
                expr = _expression(text, made, env, size) if text else None
                if expr is None and text and type(size) is int and size > 1:
                    # an expression of symbols no input has alone (a backward's 2*s27): a symbol of
                    # its own, shared by every dim recorded with the same text
                    expr = made[text] = env.create_symbol(size, source=ConstantSource(f"input{i}_size{k}"),
                                                          dynamic_dim=DimDynamic.DYNAMIC)
                if expr is not None:
                    cache[TensorPropertySource(source, TensorProperty.SIZE, k).name] = expr
            context = StatefulSymbolicContext(
                dynamic_sizes=[DimDynamic.DYNAMIC if text else DimDynamic.STATIC for text in recorded],
                constraint_sizes=[None] * value.dim(), tensor_source=source,
                shape_env_to_source_to_symbol_cache={id(env): cache})
            fakes[i] = mode.from_tensor(value, source=source, symbolic_context=context)
        elif symbols and symbols[0] and type(value) is int:
            expr = _expression(symbols[0], made, env, value)
            if expr is None:   # an expression of symbols nothing else has: a symbol of its own
                expr = env.create_symbol(value, source=ConstantSource(f"input{i}"), dynamic_dim=DimDynamic.DYNAMIC)
            fakes[i] = examples[i] = env.create_symintnode(expr, hint=value, source=ConstantSource(f"input{i}"))
    return mode, fakes, examples


def _expression(text, made, env, value):
    """The recorded size `text` (a symbol, or an expression of symbols) over this ShapeEnv's
    symbols (`made`), when it names only those and gives `value` at their sizes; else None."""
    import sympy
    if text in made:
        expr = made[text]
    else:
        names = set(re.findall(r"[A-Za-z_]\w*", text))
        if not names or not names <= set(made):
            return None
        try:
            expr = sympy.sympify(text, locals={name: made[name] for name in names})
        except (sympy.SympifyError, TypeError, SyntaxError):
            return None
    values = getattr(env, "backed_var_to_val", None) or env.var_to_val   # (renamed in newer torch)
    hints = {sym: values[sym] for sym in getattr(expr, "free_symbols", ()) if sym in values}
    if len(hints) != len(getattr(expr, "free_symbols", ())) or sympy.sympify(expr).xreplace(hints) != value:
        return None
    return expr


def compile_symbolic(gm, inputs, spec, folder, dims):
    """Compile `gm` as its backend got it when the graph had symbolic sizes: every node's
    meta["val"] (and Dynamo's "example_value") a fake of the symbolic inputs, under a tracing
    context holding their fake mode (where Dynamo and AOTAutograd leave theirs). Eager has run
    the graph on these inputs, so a failure to rebuild the symbolic graph is this runtime's, not
    the backend's: CannotRun, never a compile error that would pass for the backend's failure."""
    from torch._guards import TracingContext, tracing
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    try:
        mode, fakes, examples = symbolic_inputs(fresh(inputs), dims)
        with mode:
            FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
    except Exception as e:
        raise CannotRun(f"the graph's symbolic sizes (DYNAMIC) cannot be rebuilt in this torch "
                        f"{torch.__version__}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    for node in gm.graph.nodes:
        if "val" in node.meta:
            node.meta["example_value"] = node.meta["val"]
    with tracing(TracingContext(mode)):
        if spec.get("after", "aot") == "aot":
            aot = aot_of(spec)
            return AOT_FAMILIES[aot["family"]](gm, fakes, spec, folder, aot["graph"])
        return resolve_backend(spec, folder)(gm, examples)


# ---------------------------------------------------------------- outcomes

def _cpp_key(e):
    lines = [ln for ln in getattr(e, "full_stderr", getattr(e, "stderr", "")).splitlines() if "error:" in ln]
    return lines[0][lines[0].index("error:"):] if lines else ""


# exception class name -> the line that identifies the failure (default: first line of str(e))
KEY_LINE = {
    "CppCompileError": _cpp_key,
    "LoweringError": lambda e: getattr(e, "short", ""),
    "KernelRuntimeError": lambda e: getattr(e, "short", ""),
    "BackendCompilerFailed": lambda e: key_line(getattr(e, "inner_exception", None) or e.__cause__),
}


def key_line(e):
    if e is None:
        return ""
    custom = KEY_LINE.get(type(e).__name__)
    line = custom(e) if custom else ""
    if not line:
        line = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "")
    return normalize(line)


def normalize(line):
    """Paths, addresses and numbers blurred: they change as a graph shrinks."""
    line = re.sub(r"(?:[A-Za-z]:)?(?:/[^\s:'\"()]+)+", "<path>", line)
    line = re.sub(r"0x[0-9a-fA-F]+", "<addr>", line)
    return re.sub(r"\d+", "N", line)[:300]


def outcome(kind, **fields):
    base = {"kind": kind, "exc_type": "", "message": "", "pattern": "", "stage": "", "outputs": [],
            "signal": 0, "seconds": 0.0, "mismatches": []}
    return {**base, **fields}


def exception_outcome(kind, e):
    inner = getattr(e, "inner_exception", None) if type(e).__name__ == "BackendCompilerFailed" else None
    e = inner or e
    lines = str(e).splitlines()
    message = "\n".join(lines[:40] + ([f"... ({len(lines) - 40} more lines)"] if len(lines) > 40 else []))
    return outcome(kind, exc_type=type(e).__name__, message=message, pattern=key_line(e),
                   stage=str(getattr(e, "stage", "") or ""))


def evaluate(gm, inputs, spec, folder, accuracy):
    """Run `gm` eagerly and compiled per `spec`: the outcome dict (never raises for graph failures).

    `accuracy` provides compare/fp64_reference (tdbg's accuracy module, or repro.py's copy). An
    aten graph (after aot) runs without autograd, as AOTAutograd runs its compiled graphs; a
    Dynamo graph in the program's grad mode at the call (spec grad_enabled, default on)."""
    start = time.perf_counter()
    with torch.no_grad() if spec.get("after", "aot") == "aot" else torch.set_grad_enabled(spec.get("grad_enabled", True)):
        result = _evaluate(gm, inputs, spec, folder, accuracy)
    result["seconds"] = time.perf_counter() - start
    return result


def _evaluate(gm, inputs, spec, folder, accuracy):
    import copy
    gm, compiled_gm = snapshot(gm), gm   # eager (and its float64 twin) never run a backend's edit
    # the tensors the graph reads through get_attr (an optimizer's state, which it may change in
    # place): `gm` keeps them as loaded, each eager or float64 run gets copies of its own
    gm = copy.deepcopy(gm)
    eager_gm = copy.deepcopy(gm)
    rng = torch.get_rng_state()
    eager_in, actual_in = fresh(inputs), fresh(inputs)   # each run's inputs, its in-place changes kept
    earlier = max(int(spec.get("call", 1)) - 1, 0)   # the calls before the failing one, on its inputs
    try:
        for _ in range(earlier):
            torch.set_rng_state(rng)
            eager_gm(*fresh(inputs))
        torch.set_rng_state(rng)
        expected = eager_gm(*eager_in)
    except Exception as e:
        return exception_outcome("invalid", e)
    # eager advanced the generator: the graph draws random numbers, and the compiled graph draws
    # from the state eager started from (a backend told to draw eager's numbers draws the same)
    draws = not torch.equal(torch.get_rng_state(), rng)
    with _config_scope(spec):
        try:
            compiled = compile_graph(compiled_gm, inputs, spec, folder)
        except CannotRun as e:
            return outcome("cannot_run", exc_type="CannotRun", message=str(e))
        except Exception as e:
            return exception_outcome("compile_error", e)
        try:
            for _ in range(earlier):
                torch.set_rng_state(rng)
                compiled(*fresh(inputs))
            torch.set_rng_state(rng)
            actual = compiled(*actual_in)
        except Exception as e:
            return exception_outcome("runtime_error", e)
    if spec.get("check_accuracy"):
        found = [m.to_dict() for m in _mismatches(gm, inputs, expected, actual, spec, accuracy, draws)
                 + _in_place_mismatches(gm, inputs, eager_in, actual_in, spec, accuracy, draws)
                 + _attribute_mismatches(gm, eager_gm, compiled_gm, spec, accuracy)]
        if not found and spec.get("check_grads"):
            with _config_scope(spec):
                found = _grad_mismatches(copy.deepcopy(gm), inputs, compiled, spec, accuracy, rng if draws else None)
        if found:
            return outcome("accuracy", message="\n".join(f"{m['output']}: {m['message']}" for m in found),
                           stage="accuracy", outputs=[m["output"] for m in found], mismatches=found)
    return outcome("pass")


def _config_scope(spec):
    """tdbg's config differences the graph failed with, for the compile and the run."""
    if not uses_tdbg(spec):
        return contextlib.nullcontext()
    try:
        return _tdbg("tdbg.compiler.config").use(tdbg_config(spec))
    except CannotRun:
        return contextlib.nullcontext()   # compile_graph reports it


def _mismatches(gm, inputs, expected, actual, spec, accuracy, draws=False):
    """Outputs beyond tolerance of eager's and, unless the graph draws random numbers, of the
    float64 reference's error (a float64 run draws other numbers: its error would excuse anything)."""
    opts = {"tolerance": spec.get("tolerance"), "ignore_non_fp": bool(spec.get("ignore_non_fp"))}
    found = accuracy.compare(expected, actual, **opts)
    if not found or draws:
        return found
    return accuracy.compare(expected, actual, accuracy.fp64_reference(gm, fresh(inputs)), **opts)


def _in_place_mismatches(gm, inputs, eager_in, actual_in, spec, accuracy, draws=False):
    """The inputs eager or the compiled graph changed in place (a BatchNorm's running statistics),
    each named `NAME (changed in place)` as tdbg run's check names them: eager's copy after its
    run against the compiled run's, judged as outputs are (float64 reference unless it draws)."""
    changed = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)
               and not (same_bits(x, eager_in[i]) and same_bits(x, actual_in[i]))]
    if not changed:
        return []
    names = [n.target for n in gm.graph.nodes if n.op == "placeholder"]
    labels = [f"{names[i] if i < len(names) else f'input {i}'} (changed in place)" for i in changed]
    expected, actual = [eager_in[i].detach() for i in changed], [actual_in[i].detach() for i in changed]
    opts = {"tolerance": spec.get("tolerance"), "ignore_non_fp": bool(spec.get("ignore_non_fp")), "names": labels}
    found = accuracy.compare(expected, actual, **opts)
    if not found or draws:
        return found
    import copy
    inputs64 = accuracy.to_fp64(fresh(inputs))
    try:
        with torch.no_grad():
            copy.deepcopy(gm).to(torch.float64)(*inputs64)
    except Exception:   # a graph that cannot run in float64 is judged against eager alone
        return found
    return accuracy.compare(expected, actual, [inputs64[i] for i in changed], **opts)


def _attribute_mismatches(gm, eager_gm, compiled_gm, spec, accuracy):
    """The tensors the graph reads through get_attr that eager or the compiled run changed in
    place, named `TARGET (changed in place)`: eager's copy against the compiled module's (`gm`
    holds them as loaded), judged against eager alone."""
    rows = []
    for target in dict.fromkeys(n.target for n in gm.graph.nodes if n.op == "get_attr"):
        before, eager, compiled = (_attribute(m, target) for m in (gm, eager_gm, compiled_gm))
        if isinstance(before, torch.Tensor) and isinstance(compiled, torch.Tensor) \
                and not (same_bits(before, eager) and same_bits(before, compiled)):
            rows.append((f"{target} (changed in place)", eager.detach(), compiled.detach()))
    if not rows:
        return []
    return accuracy.compare([e for _, e, _ in rows], [c for _, _, c in rows], names=[n for n, _, _ in rows],
                            tolerance=spec.get("tolerance"), ignore_non_fp=bool(spec.get("ignore_non_fp")))


def _attribute(module, target):
    for part in target.split("."):
        module = getattr(module, part, None)
    return module


def same_bits(x, y):
    """Bit for bit, NaNs included (a sparse or other non-strided tensor counts as the same: not
    judged)."""
    x, y = x.detach(), y.detach()
    if x.layout != torch.strided or y.layout != torch.strided:
        return True
    if x.shape != y.shape or x.dtype != y.dtype:
        return False
    if torch.equal(x, y):   # one pass, no copies: the common case
        return True
    return x.is_floating_point() and torch.equal(x.isnan(), y.isnan()) and torch.equal(x.nan_to_num(0.0),
                                                                                       y.nan_to_num(0.0))


def _grad_mismatches(gm, inputs, compiled, spec, accuracy, rng=None):
    """Gradients w.r.t. the inputs that require grad, of fixed random grad_outputs (seed 0),
    compiled vs eager autograd (float64 reference), each named `grad of NAME` (as tdbg run's
    level-4 check names them): a backend whose backward is wrong fails here, not in forward.
    `rng`: the graph draws random numbers; both forwards start from this generator state and
    eager alone is the reference."""
    needs = [isinstance(x, torch.Tensor) and x.requires_grad and x.is_floating_point() for x in inputs]
    if not any(needs):
        return []
    actual = _grads(compiled, inputs, needs, rng=rng)
    expected = _grads(gm, inputs, needs, rng=rng)
    if actual is None or expected is None:
        return []
    opts = {"tolerance": spec.get("tolerance"), "ignore_non_fp": bool(spec.get("ignore_non_fp"))}
    found = accuracy.compare(expected, actual, **opts)
    if found and rng is None:
        found = accuracy.compare(expected, actual, _grads(gm, inputs, needs, torch.float64), **opts)
    names = [n.target for n in gm.graph.nodes if n.op == "placeholder"]
    wanted = [f"grad of {name}" for name, need in zip(names, needs) if need]
    return [dict(m.to_dict(), output=wanted[int(m.output[4:-1])] if m.output.startswith("out[") else m.output)
            for m in found]


def _grads(fn, inputs, needs, dtype=None, rng=None):
    """Gradients of sum(out * g) for fixed random g; None when no output is differentiable.
    `rng`: the generator state the forward starts from."""
    import copy
    if dtype is not None:
        fn = copy.deepcopy(fn).to(dtype)
    leaves = []
    for x, need in zip(fresh(inputs), needs):
        if isinstance(x, torch.Tensor):
            x = x.detach()
            x = x.to(dtype) if dtype is not None and x.is_floating_point() else x
            x.requires_grad_(need)
        leaves.append(x)
    with torch.enable_grad():
        if rng is not None:
            torch.set_rng_state(rng)
        outs = fn(*leaves)
        outs = [o for o in (outs if isinstance(outs, (list, tuple)) else [outs])
                if isinstance(o, torch.Tensor) and o.requires_grad]
        if not outs:
            return None
        generator = torch.Generator().manual_seed(0)
        cotangents = [torch.randn(o.shape, generator=generator, dtype=torch.float64).to(o.dtype) for o in outs]
        wrt = [leaf for leaf, need in zip(leaves, needs) if need]
        grads = torch.autograd.grad(outs, wrt, cotangents, allow_unused=True)
    return [g if g is not None else torch.zeros_like(w) for g, w in zip(grads, wrt)]


def matches(signature, result):
    """Whether outcome `result` fails the way `signature` (kind, exc_type, pattern, signal, check_str) says."""
    if result["kind"] != signature["kind"]:
        return False
    if signature.get("check_str") and signature["check_str"] not in result.get("message", ""):
        return False
    if signature["kind"] in ("compile_error", "runtime_error"):
        return (result.get("exc_type"), result.get("pattern")) == (signature.get("exc_type"), signature.get("pattern"))
    if signature["kind"] == "crash":
        return result.get("signal") == signature.get("signal")
    return True


def signal_name(number):
    try:
        return signal_module.Signals(number).name
    except ValueError:
        return f"signal {number}"


def summary(result):
    """One line: what happened."""
    kind = result["kind"]
    if kind == "accuracy":
        return f"accuracy mismatch in {', '.join(result['outputs'])}"
    if kind == "crash":
        return f"crash ({signal_name(result['signal'])})" if result.get("signal") else f"crash: {result['message']}"
    if kind in ("hang", "cannot_run"):
        return f"{kind.replace('_', ' ')}: {result['message']}"
    if kind in ("compile_error", "runtime_error", "invalid"):
        return f"{kind.replace('_', ' ')}: {result['exc_type']}: {result['pattern']}"
    return "passed: compiled results match eager" if kind == "pass" else kind


def exit_name(result):
    """The exit code name of a failure: its stage's (tdbg stages), else its kind's."""
    if result["kind"] in ("compile_error", "runtime_error") and result.get("stage") in EXIT_CODES:
        return result["stage"]
    return KIND_EXITS.get(result["kind"], "backend")


def verdict(result, expected):
    """(exit code, first line) of a repro run: the stage's code when the recorded failure
    reproduces, 21 when it does not (saying what happened instead), 3 when it cannot run."""
    if result["kind"] == "cannot_run":
        return EXIT_CODES["bad_input"], f"Cannot run this repro: {result['message']}"
    if result["kind"] == "invalid":
        return EXIT_CODES["bad_input"], f"Cannot run this repro: {summary(result)}"
    if result["kind"] not in FAILURE_KINDS:
        return EXIT_CODES["not_reproduced"], f"Not reproduced: {summary(result)}"
    if expected and not matches(expected, result):
        return (EXIT_CODES["not_reproduced"],
                f"Not reproduced: the recorded failure was {describe(expected)}; this run gave {summary(result)}")
    return EXIT_CODES[exit_name(result)], f"Reproduced: {summary(result)}"


def describe(signature):
    return summary(outcome(signature["kind"], exc_type=signature.get("exc_type", ""),
                           pattern=signature.get("pattern", ""), signal=signature.get("signal", 0),
                           outputs=["an output"]))


# ---------------------------------------------------------------- repro.py's main

def run_repro(namespace, argv):
    """What `python repro.py [--timeout S]` does: evaluate in a child process (so a crash is
    reported with its signal and a hang is stopped), print the verdict and the evidence, return
    the exit code."""
    if argv[:1] == ["--tdbg-child"]:
        return _child(namespace, argv[1])
    timeout = float(argv[argv.index("--timeout") + 1]) if "--timeout" in argv else None
    expected = namespace.get("EXPECTED")
    if timeout is None and expected and expected.get("kind") == "hang":
        timeout = 60.0
    result = _in_child(namespace, timeout)
    code, line = verdict(result, expected)
    print(line)
    for row in _evidence(result):
        print("  " + row)
    return code


# outcomes whose verdict line already says all there is (their whole message is in it): no evidence
# lines under it (a repro that cannot run printed "install tdbg ..." twice)
SAID_IN_VERDICT = ("pass", "crash", "hang", "cannot_run")


def _evidence(result):
    if result["kind"] == "accuracy":
        return [f"{m['output']}: {m['message']}" for m in result["mismatches"]]
    return result.get("message", "").splitlines()[:20] if result["kind"] not in SAID_IN_VERDICT else []


def _in_child(namespace, timeout):
    """The outcome of evaluating the repro in a forked child (a fresh process where fork is
    missing): a signal that kills it is a crash, a child outliving `timeout` a hang."""
    import tempfile
    with tempfile.TemporaryDirectory(prefix="repro-") as tmp:
        out = os.path.join(tmp, "outcome.json")
        code = _forked(namespace, out, timeout) if hasattr(os, "fork") else _spawned(namespace, out, timeout)
        if code is None:
            return outcome("hang", message=f"no result within {timeout:g} s")
        if code < 0:
            return outcome("crash", signal=-code, message=f"the process died from {signal_name(-code)}")
        try:
            with open(out) as f:
                return json.load(f)
        except (OSError, ValueError):
            return outcome("crash", message=f"the process exited with code {code} without a result")


def _forked(namespace, out, timeout):
    """Exit code (negative: the signal) of a forked child running _child; None on timeout."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = _child(namespace, out)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        if deadline is not None and time.monotonic() > deadline:
            os.kill(pid, signal_module.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.02)


def _spawned(namespace, out, timeout):
    proc = subprocess.Popen([sys.executable, os.path.abspath(namespace["__file__"]), "--tdbg-child", out])
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def _child(namespace, out_path):
    folder = os.path.dirname(os.path.abspath(namespace["__file__"]))
    spec = {"after": namespace["AFTER"], "backend": namespace["BACKEND"], "aot": namespace.get("AOT"),
            "config": namespace.get("CONFIG", {}), "dynamic": namespace.get("DYNAMIC", {}),
            **namespace.get("CHECK", {})}
    try:
        inputs = load_inputs(namespace["INPUTS"], folder)
        gm = trace_repro(repro_module(namespace, folder))
        result = evaluate(gm, inputs, spec, folder, _Accuracy(namespace))
    except CannotRun as e:
        result = outcome("cannot_run", exc_type="CannotRun", message=str(e))
    with open(out_path, "w") as f:
        json.dump(result, f, default=str)
    return 0


class _Accuracy:
    """compare/fp64_reference/to_fp64 from the repro file's copy of tdbg's accuracy module."""

    def __init__(self, namespace):
        self.compare, self.fp64_reference = namespace["compare"], namespace["fp64_reference"]
        self.to_fp64 = namespace["to_fp64"]
