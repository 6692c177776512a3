import pytest

from hybridflow.definition.dag import Dag
from hybridflow.errors import ConfigError


def make(edges: dict[str, tuple[list[str], list[str]]]) -> Dag:
    return Dag({s: i for s, (i, _) in edges.items()}, {s: o for s, (_, o) in edges.items()})


DIAMOND = make({
    "report": (["b", "c"], ["r"]),  # declared first, runs last
    "load": ([], ["a"]),
    "left": (["a"], ["b"]),
    "right": (["a"], ["c"]),
    "lonely": ([], ["z"]),
})


def test_order_respects_dependencies_and_file_order():
    order = DIAMOND.order()
    assert order.index("load") < order.index("left") < order.index("report")
    assert order.index("right") < order.index("report")
    assert order == ["load", "left", "right", "report", "lonely"]


def test_select_from_to_only():
    assert DIAMOND.select(start=["left"]) == ["left", "report"]
    assert DIAMOND.select(end=["left"]) == ["load", "left"]
    assert DIAMOND.select(only=["right", "load"]) == ["load", "right"]
    assert DIAMOND.select(start=["load"], end=["right"]) == ["load", "right"]


def test_unknown_stage_in_selection_suggests_a_name():
    with pytest.raises(ConfigError, match="no stage named 'lefft' \\(did you mean 'left'\\?\\)"):
        DIAMOND.select(only=["lefft"])


def test_cycle_is_found_and_printed():
    dag = make({"a": (["z"], ["x"]), "b": (["x"], ["y"]), "c": (["y"], ["z"]), "d": ([], ["w"])})
    cycle = dag.find_cycle()
    assert cycle[0] == cycle[-1] and set(cycle) == {"a", "b", "c"}
    with pytest.raises(ConfigError, match="cycle"):
        dag.order()
    assert DIAMOND.find_cycle() is None
