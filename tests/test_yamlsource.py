from hybridflow.yamlsource import load_yaml


def test_positions_of_keys_and_values_are_recorded():
    data, source, problems = load_yaml("name: x\nstages:\n  clean:\n    run: a:b\n", "p.yaml")
    assert problems == []
    assert data == {"name": "x", "stages": {"clean": {"run": "a:b"}}}
    assert (source.key_at(("stages", "clean")).line, source.key_at(("stages", "clean")).col) == (3, 3)
    assert source.value_at(("stages", "clean", "run")).line == 4
    # an unknown path falls back to the nearest known ancestor
    assert source.value_at(("stages", "clean", "run", "nope")).line == 4


def test_duplicate_keys_are_reported_at_both_lines():
    _, _, problems = load_yaml("name: a\nparams: {}\nname: b\n", "p.yaml")
    assert sorted(p.line for p in problems) == [1, 3]
    assert all("duplicate key 'name'" in p.message for p in problems)


def test_python_tags_are_rejected_not_executed(tmp_path):
    marker = tmp_path / "pwned"
    text = f"name: !!python/object/apply:os.system ['touch {marker}']\n"
    _, _, problems = load_yaml(text, "p.yaml")
    assert not marker.exists()
    assert len(problems) == 1 and "tag !!python/object/apply:os.system is not allowed" in problems[0].message
    assert problems[0].line == 1


def test_keys_keep_their_text_so_yaml11_booleans_do_not_bite():
    data, _, problems = load_yaml("params:\n  on: 1\n  NO: yes\n", "p.yaml")
    assert problems == []
    assert data == {"params": {"on": 1, "NO": True}}


def test_merge_keys_are_expanded_and_explicit_keys_win():
    text = "base: &b {backend: python, retries: 2}\nstage:\n  <<: *b\n  retries: 3\n"
    data, _, problems = load_yaml(text, "p.yaml")
    assert problems == []
    assert data["stage"] == {"backend": "python", "retries": 3}


def test_syntax_error_has_a_location():
    _, _, problems = load_yaml("name: x\nstages: [a, b\n", "p.yaml")
    assert len(problems) == 1
    assert problems[0].message.startswith("YAML syntax error")
    assert problems[0].line >= 2


def test_recursive_aliases_are_an_error_not_a_crash():
    _, _, problems = load_yaml("a: &x\n  b: *x\n", "p.yaml")
    assert len(problems) == 1 and "recursive" in problems[0].message
