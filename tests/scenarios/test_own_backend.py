"""Every command runs the script as written unless --backend says otherwise: each torch.compile
call's own backend, mode and options (`own`, the default), and `--backend NAME` replaces them with
a line per replaced call. A plain `tdbg run` compares with eager and its OK says what it compared.
Scripts: the troubleshooting seed's toy_compiler, and own_backends.py (one case per argv)."""
import pytest

from tdbg.cli.console import exit_code

S = "tests/scenarios/scripts"
OWN = f"{S}/own_backends.py"
RUNS = {
    "toy_own": (("run", "examples/toy_compiler.py"), {}),
    "toy_replaced": (("run", "examples/toy_compiler.py", "--backend", "inductor"), {}),
    "foo2_checked": (("run", "examples/foo2.py", "--backend", "inductor"), {"TDBG_INJECT_BUG": "neg:accuracy"}),
    "foo2_unchecked": (("run", "examples/foo2.py", "--backend", "inductor", "--no-check-accuracy"),
                       {"TDBG_INJECT_BUG": "neg:accuracy"}),
    "mode": (("run", OWN, "--", "mode"), {}),
    "mode_replaced": (("run", OWN, "--backend", "eager", "--", "mode"), {}),
    "lambda": (("run", OWN, "--", "lambda"), {}),
    "two": (("run", OWN, "--backend", "own", "--", "two"), {}),
    "aot": (("run", OWN, "--", "aot"), {}),
    "layers_replaced": (("run", OWN, "--backend", "inductor", "--", "layers"), {}),
    "torch_layers": (("run", OWN, "--backend", "inductor", "--", "torch_layers"), {}),
    "torch_layers_compare": (("compare", OWN, "--backend", "inductor", "--", "torch_layers"), {}),
    "torch_layers_bisect": (("bisect", OWN, "--backend", "inductor", "--", "torch_layers"), {}),
    "bisect_toy": (("bisect", "examples/toy_compiler.py"), {}),
    "bisect_two": (("bisect", OWN, "--", "two"), {}),
}


@pytest.fixture(scope="module")
def runs(tdbg_runs):
    tdbg_runs.start(*RUNS.values())
    return lambda name: tdbg_runs(*RUNS[name])


def rows(r) -> list:
    return r.json["verdict"]["compile_backends"]["rows"]


def test_the_scripts_own_backend_runs_and_its_failure_is_reported(runs):
    r = runs("toy_own")
    assert r.code == exit_code("backend"), r.output
    assert "backend: examples/toy_compiler.py:toy_compiler (the script's own)" in r.stdout
    assert "AssertionError: toy_compiler does not support relu" in r.stdout
    assert [(x["asked"], x["ran"], x["replaced"]) for x in rows(r)] == [
        ("toy_compiler", "examples/toy_compiler.py:toy_compiler", False)]
    # the next commands name the backend the script's own call resolved to
    assert r.json["next_commands"] == [
        "tdbg bisect examples/toy_compiler.py --backend examples/toy_compiler.py:toy_compiler",
        "tdbg minify examples/toy_compiler.py --after dynamo --level 2 --backend examples/toy_compiler.py:toy_compiler"]


def test_a_replaced_backend_is_named_per_compile_call(runs):
    r = runs("toy_replaced")
    assert r.code == 0, r.output
    assert ("replaced: your script asked for toy_compiler (torch.compile call 1); ran tdbg's compiler (inductor) "
            "instead (--backend inductor)") in r.stdout
    assert [(x["asked"], x["ran"], x["replaced"]) for x in rows(r)] == [("toy_compiler", "inductor", True)]


def test_mode_and_options_stay_with_the_call_and_are_reported_when_replaced(runs):
    r = runs("mode")
    assert r.code == 0, r.output
    assert [(x["asked"], x["mode"], x["ran"], x["replaced"]) for x in rows(r)] == [
        ("torch:inductor (torch.compile's default), mode=reduce-overhead", "reduce-overhead", "torch:inductor", False)]
    replaced = runs("mode_replaced")
    assert replaced.code == 0, replaced.output
    assert ("replaced: your script asked for torch:inductor (torch.compile's default), mode=reduce-overhead "
            "(torch.compile call 1); ran eager instead (--backend eager)") in replaced.stdout


def test_plain_run_compares_with_eager_and_ok_says_what_was_not_compared(runs):
    checked = runs("foo2_checked")
    assert checked.code == exit_code("accuracy"), checked.output
    assert checked.json["options"]["check_accuracy"] is True
    unchecked = runs("foo2_unchecked")
    assert unchecked.code == 0, unchecked.output
    assert ("1 graph(s) compiled by tdbg's compiler (inductor) and ran without error; results NOT compared with "
            "eager (--no-check-accuracy)") in unchecked.stdout


def test_ok_names_the_graphs_compared(runs):
    r = runs("aot")
    assert r.code == 0, r.output
    assert (f"OK {OWN}: 1 graph(s) compiled by {OWN}:aot_backend (the script's own); results match eager on 1 of 1 "
            "graph(s) (1 call(s) compared, gradients on 0)") in r.stdout
    assert rows(r)[0]["asked"] == "aot_backend"


def test_layers_compiled_one_by_one_share_one_graph_as_in_the_scripts_own_run(runs):
    """Dynamo serves every layer of a class with the graph the first one compiled, as long as
    the calls share a backend: the replacing backend is one object per compiler, so the run
    compiles what the script compiles (before: one graph per layer), and checks every call."""
    r = runs("layers_replaced")
    assert r.code == 0, r.output
    assert (f"OK {OWN}: 1 graph(s) compiled by tdbg's compiler (inductor); results match eager on 1 of 1 "
            "graph(s) (3 call(s) compared, gradients on 0)") in r.stdout
    assert [(x["asked"], x["ran"], x["replaced"]) for x in rows(r)] == [("eager", "inductor", True)]


@pytest.mark.parametrize("name", ["torch_layers", "torch_layers_compare"])
def test_compile_calls_that_compile_no_graph_are_bad_input_never_ok(runs, name):
    """Module.compile on nn.Linear layers: three torch.compile calls, and Dynamo compiles no graph
    (it skips torch's own frames). Nothing was compared, so no command may say OK or 'match'."""
    r = runs(name)
    assert r.code == exit_code("bad_input"), r.output
    assert "OK" not in r.stdout and "match" not in r.stdout
    assert (f"{OWN} called torch.compile 3 time(s), but Dynamo compiled no graph from what it was given, "
            "so nothing was compared with eager.") in " ".join(r.output.split())


def test_bisect_over_calls_that_compile_no_graph_is_bad_input_not_a_pass(runs):
    r = runs("torch_layers_bisect")
    assert r.code == exit_code("bad_input"), r.output
    assert r.json["verdict"]["summary"].startswith("the script's 3 torch.compile call(s) compiled no graph under eager")
    assert [b["backend"] for b in r.json["backends"]] == ["eager"]   # the rest would compile nothing either


def test_unnamed_and_several_backends_run_as_written(runs):
    r = runs("lambda")
    assert r.code == 0, r.output
    assert r.json["verdict"]["compile_backends"]["unnamed"] == ["<lambda>"]
    two = runs("two")
    assert two.code == 0, two.output
    assert [(x["asked"], x["ran"]) for x in rows(two)] == [
        ("eager", "torch:eager"), ("counting_backend", f"{OWN}:counting_backend")]


def test_bisect_follows_the_scripts_own_backend(runs):
    r = runs("bisect_toy")
    assert r.code == exit_code("backend"), r.output
    assert r.json["chain"] == ["eager", "examples/toy_compiler.py:toy_compiler"]
    assert r.json["first_failing_backend"] == "examples/toy_compiler.py:toy_compiler"
    assert "Backend: examples/toy_compiler.py:toy_compiler, the script's own (torch.compile asks for toy_compiler)" \
        in r.stdout


def test_bisect_refuses_to_guess_between_several_backends(runs):
    r = runs("bisect_two")
    assert r.code == exit_code("bad_input"), r.output
    assert r.json["verdict"]["summary"] == (
        "the script's torch.compile calls ask for several backends (counting_backend, eager); bisect follows one "
        "chain: choose the backend with --backend NAME")

