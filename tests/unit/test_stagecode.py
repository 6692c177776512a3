"""Reading stage functions statically, without importing them."""

from hybridflow.definition.stagecode import inspect_target


def test_functions_defined_in_blocks_or_star_imports_are_not_false_errors(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "guarded.py").write_text("try:\n    import fast\nexcept ImportError:\n"
                                                 "    def clean(events):\n        return events\n")
    (tmp_path / "pkg" / "star.py").write_text("from pkg.guarded import *\n")
    (tmp_path / "pkg" / "latin.py").write_bytes("# -*- coding: latin-1 -*-\n# caf\xe9\ndef go(x):\n    return x\n"
                                                .encode("latin-1"))
    guarded = inspect_target(tmp_path, "pkg.guarded:clean")
    assert guarded.error is None and [p.name for p in guarded.params] == ["events"]
    star = inspect_target(tmp_path, "pkg.star:clean")
    assert star.error is None and star.params is None  # checked when the run imports it
    latin = inspect_target(tmp_path, "pkg.latin:go")
    assert latin.error is None and [p.name for p in latin.params] == ["x"]
    missing = inspect_target(tmp_path, "pkg.guarded:clena")
    assert missing.error == "module 'pkg.guarded' has no function 'clena' (did you mean 'clean'?)"


def test_a_stage_function_is_imported_while_another_thread_imports(tmp_path):
    """The MLflow sender imports mlflow's modules in its thread while the next stage's function is
    imported in the main thread: sys.modules changing size meanwhile must not fail the stage."""
    import sys
    import threading

    from hybridflow.definition.stagecode import import_function

    (tmp_path / "churnsteps.py").write_text("def train(x):\n    return x\n")
    done = threading.Event()

    def imports_meanwhile() -> None:
        while not done.is_set():  # modules arriving, then leaving
            for count in range(20):
                sys.modules[f"hybridflow_test_racing_{count}"] = sys
            for count in range(20):
                sys.modules.pop(f"hybridflow_test_racing_{count}", None)

    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    racer = threading.Thread(target=imports_meanwhile, daemon=True)
    racer.start()
    try:
        for _ in range(300):
            assert import_function(tmp_path, "churnsteps:train")(3) == 3
    finally:
        done.set()
        racer.join()
        sys.setswitchinterval(switching)
        for name in [n for n in list(sys.modules) if n.startswith(("hybridflow_test_racing_", "churnsteps"))]:
            sys.modules.pop(name, None)
