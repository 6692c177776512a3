"""Which keyword arguments a stage function gets: its inputs, matching params and `ctx`.

One rule set shared by `validate` (reading the function with `ast`, never importing
it) and by the runner (with `inspect`), so both agree on what a call will be.
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass
from typing import Callable, Iterable

CTX = "ctx"


@dataclass(frozen=True)
class Parameter:
    name: str
    required: bool
    kind: str  # "keyword" | "positional_only" | "var_keyword" | "var_positional"


def from_ast(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[Parameter]:
    args = node.args
    params: list[Parameter] = []
    positional = args.posonlyargs + args.args
    first_default = len(positional) - len(args.defaults)
    for i, arg in enumerate(positional):
        kind = "positional_only" if i < len(args.posonlyargs) else "keyword"
        params.append(Parameter(arg.arg, i < first_default, kind))
    if args.vararg:
        params.append(Parameter(args.vararg.arg, False, "var_positional"))
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        params.append(Parameter(arg.arg, default is None, "keyword"))
    if args.kwarg:
        params.append(Parameter(args.kwarg.arg, False, "var_keyword"))
    return params


def from_callable(fn: Callable) -> list[Parameter]:
    kinds = {
        inspect.Parameter.POSITIONAL_ONLY: "positional_only",
        inspect.Parameter.VAR_POSITIONAL: "var_positional",
        inspect.Parameter.VAR_KEYWORD: "var_keyword",
    }
    params = []
    for p in inspect.signature(fn).parameters.values():
        kind = kinds.get(p.kind, "keyword")
        required = p.default is inspect.Parameter.empty and kind in ("keyword", "positional_only")
        params.append(Parameter(p.name, required, kind))
    return params


def call_problems(params: list[Parameter], inputs: Iterable[str], param_names: Iterable[str]) -> list[str]:
    """Why a call with these inputs and params cannot work (empty when it can)."""
    problems = []
    inputs, param_names = list(inputs), set(param_names)
    names = {p.name for p in params if p.kind in ("keyword", "positional_only")}
    takes_any = any(p.kind == "var_keyword" for p in params)
    for p in params:
        if p.kind == "positional_only" and p.required:
            problems.append(f"parameter '{p.name}' is positional-only: hybridflow passes everything by "
                            "name (remove the '/' from the signature)")
        elif p.kind == "keyword" and p.required and p.name not in inputs and p.name not in param_names \
                and p.name != CTX:
            problems.append(f"parameter '{p.name}' gets no value: it is not an input, a param or ctx "
                            f"(add it to the stage's inputs or params, or give it a default)")
    if not takes_any:
        for name in inputs:
            if name not in names:
                problems.append(f"input '{name}' is not a parameter of the function "
                                f"(add a parameter named '{name}' or **kwargs)")
    return problems


def call_arguments(params: list[Parameter], inputs: dict, param_values: dict, ctx) -> dict:
    """The keyword arguments for one call (assumes call_problems() found nothing)."""
    takes_any = any(p.kind == "var_keyword" for p in params)
    names = {p.name for p in params if p.kind == "keyword"}
    kwargs = {k: v for k, v in param_values.items() if takes_any or k in names}
    kwargs.update(inputs)
    if CTX in names:
        kwargs[CTX] = ctx
    return kwargs
