import subprocess
import sys

import pytest

from hybridflow.definition.config import check_file
from hybridflow.definition.yamlsource import MAX_DEPTH, MAX_FILE_BYTES, load_yaml, scalar_or_text

EXIT_CONFIG = 78
# A refused file takes well under a second; an unbounded expansion ran for minutes and gigabytes, so
# finishing within this (generous, for a loaded machine) limit at all is what shows the bound works.
GENEROUS_S = 120


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


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """The "billion laughs" shape: each level is a list of `width` aliases of the level below."""
    lines = ["name: bomb", "stages: {}", "params:", "  l0: &l0 [" + ", ".join(["lol"] * width) + "]"]
    lines += [f"  l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def nested(depth: int, opening: str = "[", closing: str = "]", leaf: str = "1") -> str:
    return f"name: deep\nstages: {{}}\nx: {opening * depth}{leaf}{closing * depth}\n"


def test_alias_bomb_is_refused_at_the_alias_that_passes_the_bound():
    # l0 to l3 add 9*10 + 9*91 + 9*820 = 8,289 nodes through aliases; l4's first alias passes 10,000.
    data, _, problems = load_yaml(alias_bomb(), "p.yaml")
    assert data is None
    assert [(p.line, p.col) for p in problems] == [(8, 12)]
    assert "aliases would expand to more than 10,000 nodes" in problems[0].message


def test_aliases_count_what_they_expand_to_not_how_often_they_are_written():
    # 2 levels of 100 aliases: 100 * 101 = 10,100 nodes, from 101 alias occurrences
    _, _, problems = load_yaml(alias_bomb(levels=2, width=100), "p.yaml")
    assert len(problems) == 1 and "alias bomb" in problems[0].message


def test_anchors_and_merge_keys_used_normally_still_work():
    stages = "".join(f"  s{i}:\n    <<: *defaults\n    run: m:f{i}\n    tags: *tags\n" for i in range(200))
    text = ("defaults: &defaults {backend: python, retries: 2, params: {a: 1, b: [1, 2, 3]}}\n"
            "tags: &tags [x, y]\nstages:\n" + stages)
    data, _, problems = load_yaml(text, "p.yaml")
    assert problems == []
    assert len(data["stages"]) == 200
    assert data["stages"]["s199"] == {"backend": "python", "retries": 2, "params": {"a": 1, "b": [1, 2, 3]},
                                      "run": "m:f199", "tags": ["x", "y"]}


@pytest.mark.parametrize("text", [nested(5000), nested(3000, "{a: ", "}"),
                                  "x:\n" + "".join(f"{'  ' * i}k{i}:\n" for i in range(1, 150)) + "  " * 150 + "1\n"],
                         ids=["5000 lists", "3000 flow mappings", "150 block mappings"])
def test_deep_nesting_is_an_error_not_a_recursion_error(text):
    data, _, problems = load_yaml(text, "p.yaml")
    assert data is None
    assert len(problems) == 1
    assert f"nested more than {MAX_DEPTH} levels deep" in problems[0].message
    assert problems[0].line > 1


def test_nesting_up_to_the_bound_is_fine():
    # the top-level mapping is the first level
    data, _, problems = load_yaml(nested(MAX_DEPTH - 1), "p.yaml")
    assert problems == []
    value = data["x"]
    for _ in range(MAX_DEPTH - 1):
        value = value[0]
    assert value == 1
    _, _, problems = load_yaml(nested(MAX_DEPTH), "p.yaml")
    assert len(problems) == 1 and (problems[0].line, problems[0].col) == (3, 4 + MAX_DEPTH - 1)


def test_aliases_cannot_nest_past_the_bound():
    """Each anchor is shallow, but every alias adds its anchor's depth once expanded."""
    lines = [f"x{i}: &x{i} " + "[" * 40 + (f"*x{i - 1}" if i else "1") + "]" * 40 for i in range(4)]
    _, _, problems = load_yaml("\n".join(lines) + "\n", "p.yaml")
    assert len(problems) == 1
    assert problems[0].line == 3 and "this alias nests the file more than 100 levels deep" in problems[0].message


def test_text_over_the_size_limit_is_refused_before_parsing():
    _, _, problems = load_yaml("name: x\n" + "#" * MAX_FILE_BYTES, "p.yaml")
    assert [(p.line, p.col) for p in problems] == [(1, 1)]
    assert "a pipeline file may be at most 1 MiB" in problems[0].message


def test_a_huge_file_is_refused_without_being_read(tmp_path):
    path = tmp_path / "huge.yaml"
    with path.open("wb") as stream:
        stream.truncate(50 * 1024 * 1024)  # sparse: 50 MiB that take no disk
    pipeline, problems = check_file(path)
    assert pipeline is None
    assert [(p.file, p.line, p.col) for p in problems] == [(str(path), 1, 1)]
    assert "at most 1 MiB and this one is 50.0 MiB" in problems[0].message


@pytest.mark.parametrize("raw, value", [("3", 3), ("2.5", 2.5), ("true", True), ("~", None), ("a: b", "a: b"),
                                        ("[1, 2]", "[1, 2]"), ("!!binary aGk=", "!!binary aGk="),
                                        ("!!python/name:os.system", "!!python/name:os.system"),
                                        ("[" * 5000, "[" * 5000)])
def test_command_line_values_are_scalars_or_stay_text(raw, value):
    assert scalar_or_text(raw) == value


def test_command_line_alias_bomb_stays_text():
    text = alias_bomb().replace("\n", " ").replace("name: bomb stages: {} params:", "{") + "}"
    assert scalar_or_text(text) == text


def cli_validate(path):
    return subprocess.run([sys.executable, "-m", "hybridflow.cli", "validate", str(path)],
                          capture_output=True, text=True, timeout=GENEROUS_S)


@pytest.mark.parametrize("name, text, where, message", [
    ("bomb", alias_bomb(), "8:12", "aliases would expand to more than 10,000 nodes"),
    ("lists", nested(5000), "3:103", "mappings and lists are nested more than 100 levels deep"),
    ("mappings", nested(3000, "{a: ", "}"), "3:400", "mappings and lists are nested more than 100 levels deep"),
    ("big", "name: big\nstages: {}\ndescription: |\n" + ("  " + "x" * 98 + "\n") * 20_000, "1:1",
     "a pipeline file may be at most 1 MiB and this one is 1.9 MiB"),
], ids=["alias bomb", "5000 nested lists", "3000 nested mappings", "2 MiB file"])
def test_hostile_files_are_config_errors_through_the_cli(tmp_path, name, text, where, message):
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    done = cli_validate(path)
    assert done.returncode == EXIT_CONFIG, done.stdout + done.stderr
    assert f"{path}:{where}: error: {message}" in done.stdout, done.stdout + done.stderr
    assert "internal error" not in done.stdout + done.stderr
