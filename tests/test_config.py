"""compiler/config.py: the one reader of TDBG_* variables, and its round trips."""
import pytest

from tdbg.compiler import config as C


def test_defaults_without_environment():
    cfg = C.from_env({})
    assert cfg == C.Config()
    assert cfg.inject_bug is None and cfg.fallback_ops == frozenset()


def test_every_env_row_reaches_its_field():
    values = {"TDBG_COMPILE_DEBUG": "1", "TDBG_DEBUG_DIR": "d", "TDBG_CACHE_DIR": "/c", "TDBG_CXX": "clang++",
              "TDBG_NUM_THREADS": "3", "TDBG_MAX_FUSION_SIZE": "5", "TDBG_SIMDLEN": "0",
              "TDBG_MIN_CHUNK_SIZE": "7", "TDBG_FUSION": "0", "TDBG_PARALLEL": "off", "TDBG_VECTORIZE": "no",
              "TDBG_DECOMPOSE": "false", "TDBG_LAYOUT_OPTIMIZATION": "0", "TDBG_PACK_WEIGHTS": "off",
              "TDBG_HOIST_WEIGHTS": "0", "TDBG_BIAS_EPILOGUE": "no", "TDBG_LINEAR_GELU": "0", "TDBG_CONCAT_LINEARS": "0", "TDBG_FALLBACK_RANDOM": "1", "TDBG_FALLBACK_OPS": "neg,aten.add.Tensor",
              "TDBG_MAX_LOWERED_OPS": "4", "TDBG_MAX_FUSIONS": "2", "TDBG_KERNEL_PROFILE": "1", "TDBG_REUSE_OUTPUTS": "0",
              "TDBG_INJECT_BUG": "neg:crash", "TDBG_REPORT": "/r.jsonl", "TDBG_DYNAMIC": "specialize",
              "TDBG_CPU_VENDOR": "other"}
    assert set(values) == set(C._ENV)  # the test covers the whole table
    cfg = C.from_env(values)
    assert (cfg.debug, cfg.debug_dir, cfg.cache_dir, cfg.cxx) == (True, "d", "/c", "clang++")
    assert (cfg.num_threads, cfg.max_fusion_size, cfg.simdlen, cfg.min_chunk_size) == (3, 5, 0, 7)
    assert (cfg.fusion, cfg.parallel, cfg.vectorize, cfg.decompose) == (False, False, False, False)
    assert not cfg.layout_optimization and not cfg.pack_weights and not cfg.hoist_weights and not cfg.bias_epilogue
    assert not cfg.concat_linears and not cfg.linear_gelu
    assert cfg.fallback_random and cfg.enable_kernel_profile and not cfg.reuse_outputs
    assert cfg.fallback_ops == frozenset({"neg", "aten.add.Tensor"})
    assert (cfg.max_lowered_ops, cfg.max_fusions) == (4, 2)
    assert cfg.inject_bug == ("neg", "crash") and cfg.report_path == "/r.jsonl"
    assert cfg.dynamic == "specialize" and cfg.cpu_vendor == "other"


@pytest.mark.parametrize("vendor_id,vendor", [("GenuineIntel", "intel"), ("AuthenticAMD", "amd"),
                                              ("HygonGenuine", "amd"), ("CentaurHauls", "other"), (None, "other")])
def test_cpu_vendor_read_from_cpuinfo(tmp_path, vendor_id, vendor):
    from tdbg.compiler.toolchain import cpu_vendor
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\n" + (f"vendor_id\t: {vendor_id}\n" if vendor_id else "") + "flags\t: fpu\n")
    assert cpu_vendor(str(info)) == vendor
    assert cpu_vendor(str(tmp_path / "missing")) == "other"


def test_an_unknown_cpu_vendor_is_refused():
    with pytest.raises(ValueError, match="cpu_vendor must be one of amd, intel, other"):
        C.from_env({"TDBG_CPU_VENDOR": "arm"})


def test_logs_spec_splits_verbose_channels():
    cfg = C.from_env({"TDBG_LOGS": "+schedule,output_code"})
    assert cfg.logs == frozenset({"schedule", "output_code"})
    assert cfg.verbose_logs == frozenset({"schedule"})


@pytest.mark.parametrize("var,value,needle", [
    ("TDBG_INJECT_BUG", "neg:boom", "TDBG_INJECT_BUG='neg:boom'"),
    ("TDBG_INJECT_BUG", "nge:accuracy", "TDBG_INJECT_BUG='nge:accuracy': inject_bug op 'nge' is not an op tdbg "
                                        "lowers, so no generated code could break; ops: _to_copy, "
                                        "_unsafe_masked_index_put_accumulate, _unsafe_view, abs,"),
    ("TDBG_CONFIG", '{"simdlenn": 0}', "TDBG_CONFIG='{\"simdlenn\": 0}': unknown config key(s) 'simdlenn'; keys: "
                                       "max_fusion_size, fusion, max_fusions,"),
    ("TDBG_CONFIG", "[0]", "TDBG_CONFIG='[0]': expected a JSON object of config fields, got list"),
    ("TDBG_NUM_THREADS", "many", "TDBG_NUM_THREADS='many'"),
    ("TDBG_LOGS", "dynamo", "unknown log channel 'dynamo'"),
])
def test_bad_values_name_the_variable(var, value, needle):
    with pytest.raises(ValueError) as e:
        C.from_env({var: value})
    assert needle in str(e.value)


def test_json_round_trip_and_child_environment():
    cfg = C.Config(inject_bug=("neg", "accuracy"), fallback_ops=frozenset({"add"}), logs=frozenset({"graph"}),
                   max_fusions=3)
    assert C.Config.from_json(cfg.to_json()) == cfg
    assert C.from_env(C.to_env(cfg)) == cfg
    # individual variables override the TDBG_CONFIG base
    assert C.from_env({**C.to_env(cfg), "TDBG_MAX_FUSIONS": "9"}).max_fusions == 9


def test_patch_sets_and_restores_the_process_default():
    before = C.current()
    with C.Config.patch(inject_bug=("neg", "accuracy")) as cfg:
        assert C.current() is cfg and cfg.inject_bug == ("neg", "accuracy")
        with cfg.patch(simdlen=0):
            assert C.current().simdlen == 0 and C.current().inject_bug == ("neg", "accuracy")
        assert C.current() is cfg
    assert C.current() is before


def test_repro_env_prefers_tdbg_names_and_honours_torch_names():
    assert C.repro_from_env({}) == (None, 2)
    assert C.repro_from_env({"TORCHDYNAMO_REPRO_AFTER": "aot", "TORCHDYNAMO_REPRO_LEVEL": "4"}) == ("aot", 4)
    assert C.repro_from_env({"TDBG_REPRO_AFTER": "dynamo", "TORCHDYNAMO_REPRO_AFTER": "aot"}) == ("dynamo", 2)
    with pytest.raises(ValueError, match="repro_level must be 1, 2, 3 or 4"):
        C.repro_from_env({"TDBG_REPRO_LEVEL": "7"})


def test_injectable_ops_are_the_lowered_ops():
    """config.INJECTABLE_OPS (torch-free) names exactly the ops lowering.py lowers."""
    from tdbg.compiler import lowering, lowering_reductions  # noqa: F401  (registers the reductions)
    from tdbg.compiler.ops import op_name
    assert C.INJECTABLE_OPS == {op_name(t) for t in lowering.LOWERINGS}


@pytest.mark.parametrize("spec", ["neg", "aten.neg", "aten.neg.default", "prims.convert_element_type.default"])
def test_inject_bug_accepts_every_spelling_of_a_lowered_op(spec):
    assert C.from_env({"TDBG_INJECT_BUG": f"{spec}:accuracy"}).inject_bug == (spec, "accuracy")


def test_programmatic_config_refuses_an_unknown_op_too():
    with pytest.raises(ValueError, match="inject_bug op 'mm' is not an op tdbg lowers"):
        C.Config(inject_bug=("mm", "accuracy"))
