"""The one backend resolver: every spelling, and clear errors for the wrong ones."""
import pytest

from tdbg.minifier.runs import backends


@pytest.mark.parametrize("name", ["eager", "aot_eager", "inductor", "tdbg", "torch:inductor", "tdbg.compiler:compile_fx",
                                  "examples/toy_compiler.py:toy_compiler"])
def test_valid_names_pass_the_torch_free_check(name):
    backends.check_name(name)


@pytest.mark.parametrize("name, phrase", [
    ("inductr", "unknown backend 'inductr' (did you mean inductor or torch:inductor?): choose one of own (each "
                "torch.compile call's own backend, the default), eager, aot_eager, inductor (tdbg's compiler; also "
                "spelled tdbg), torch:NAME (a backend registered with Dynamo; torch:inductor is PyTorch's Inductor)"),
    ("nofile.py:fn", "file 'nofile.py' does not exist"),
    ("1bad:fn", "is not MODULE:FUNCTION or FILE.py:FUNCTION"),
])
def test_wrong_names_are_explained(name, phrase):
    with pytest.raises(backends.BackendError, match=None) as info:
        backends.check_name(name)
    assert phrase in str(info.value)


def test_a_misspelled_dynamo_backend_gets_the_nearest_usable_names():
    with pytest.raises(backends.BackendError) as info:
        backends.resolve("torch:indcutor")
    text = str(info.value)
    assert text.startswith("unknown backend 'torch:indcutor' (did you mean torch:inductor?): Dynamo has no backend")
    assert "TESTING_ONLY" not in text     # Dynamo's internal test backends are not offered


def test_own_names_no_one_backend():
    backends.check_name("own")            # a valid --backend value (every command's default) ...
    with pytest.raises(backends.BackendError, match="resolved per compile call"):
        backends.resolve("own")           # ... that only the child, per compile call, resolves


def test_resolve_kinds():
    import torch
    from tdbg.compiler.config import Config
    cfg = Config()
    kinds = {name: backends.resolve(name, cfg).kind for name in
             ("eager", "aot_eager", "inductor", "torch:inductor", "tdbg.compiler:compile_fx")}
    assert kinds == {"eager": "eager", "aot_eager": "aot_eager", "inductor": "inductor", "torch:inductor": "torch",
                     "tdbg.compiler:compile_fx": "user"}
    gm = torch.fx.symbolic_trace(lambda x: torch.neg(x) * 2)
    x = torch.randn(3)
    assert torch.equal(backends.resolve("eager", cfg).compiler_fn(gm, [x])(x), gm(x))
    with pytest.raises(backends.BackendError, match="Dynamo has no backend named 'nope'.*inductor"):
        backends.resolve("torch:nope", cfg)
    with pytest.raises(backends.BackendError, match="no callable named 'missing'"):
        backends.resolve("tdbg.compiler:missing", cfg)


def test_file_backend_of_the_running_script_is_looked_up_late(monkeypatch):
    import sys
    import types
    fake_main = types.ModuleType("__main__")
    fake_main.my_backend = lambda gm, inputs: "compiled"
    b = backends.resolve("examples/toy_compiler.py:my_backend", None, script="examples/toy_compiler.py")
    monkeypatch.setitem(sys.modules, "__main__", fake_main)
    assert b.compiler_fn(None, []) == "compiled"


@pytest.mark.parametrize("files, name, phrase", [
    ({"be.py": "\ndef be(gm, inputs)\n    return gm\n"}, "{tmp}/be.py:be",
     "backend '{tmp}/be.py:be': loading {tmp}/be.py failed at {tmp}/be.py:2: SyntaxError: expected ':'."),
    ({"be.py": "import helper_that_is_missing\n"}, "{tmp}/be.py:be",
     "loading {tmp}/be.py failed at {tmp}/be.py:1: ModuleNotFoundError: No module named 'helper_that_is_missing'."),
    ({"tdbg_test_pkg/__init__.py": "from .impl import be\n", "tdbg_test_pkg/impl.py": "x = 1\nraise KeyError('k')\n"},
     "tdbg_test_pkg:be", "importing module 'tdbg_test_pkg' failed at {tmp}/tdbg_test_pkg/impl.py:2: KeyError: 'k'."),
    ({}, "tdbg_test_no_such_pkg:be", "cannot import module 'tdbg_test_no_such_pkg' (No module named"),
])
def test_a_backend_that_fails_to_load_is_bad_input_with_its_line(tmp_path, monkeypatch, files, name, phrase):
    """Before: a syntax error or a failing import escaped as an internal error (exit 70)."""
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(backends.BackendError) as info:
        backends.resolve(name.replace("{tmp}", str(tmp_path)))
    assert phrase.replace("{tmp}", str(tmp_path)) in str(info.value)
