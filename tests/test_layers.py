"""The layers hold: ``lint-imports`` keeps the contract of ``[tool.importlinter]`` in pyproject.toml (each module
imports only from layers below its own, every module of vlmrl placed in a layer) and no import cycle exists inside
vlmrl/ (imports in functions and under ``TYPE_CHECKING`` count)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def cycles(edges: dict[str, list[str]]) -> list[list[str]]:
    """The import cycles of a graph (module -> the modules it imports): its strongly connected components of more
    than one module (Tarjan's algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(edges.get(root, [])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(edges.get(w, []))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_layer_contract_holds() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    run = subprocess.run([str(lint)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "Contracts: 1 kept, 0 broken." in run.stdout, run.stdout[-4000:] + run.stderr


def test_no_import_cycle_inside_vlmrl() -> None:
    import grimp

    graph = grimp.build_graph("vlmrl")
    edges = {
        m: sorted(x for x in graph.find_modules_directly_imported_by(m) if x.startswith("vlmrl"))
        for m in graph.modules
        if m.startswith("vlmrl")
    }
    assert len(edges) > 100, sorted(edges)
    found = cycles(edges)
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_cycle_finder_finds_cycles() -> None:
    """The finder itself, on a small graph: a three-module cycle and a self-contained pair, a tail that is none."""
    edges = {"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": [], "e": ["f"], "f": ["e"], "g": ["a"]}
    assert sorted(cycles(edges)) == [["a", "b", "c"], ["e", "f"]]
    assert cycles({"a": ["b"], "b": []}) == []


def test_no_function_in_vlmrl_is_over_60_lines() -> None:
    """A function reads on one screen: none in vlmrl/ is over 60 lines (signature, docstring and body)."""
    import ast

    long = []
    for path in sorted((REPO / "vlmrl").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 60:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "\n".join(long)


DERIVED = ("planned_device", "planned_world", "separate_pools", "critic_plan", "launcher_of", "needs_of", "tp_size")
"""``vlmrl.config.plan``'s derivations that the gate computes once into a ``RunPlan``."""
DERIVING = {
    "vlmrl/config/plan.py": "where they are defined, and run_plan",
    "vlmrl/config/checks.py": "the value checks, which run before the plan exists (plugins load in them)",
    "vlmrl/workers/launch_ray.py": "trainer.device=auto resolved against the cluster's resources, not this machine's",
}


def test_derived_values_are_computed_once_by_the_gate() -> None:
    """Issue 42, one gate: outside the gate (``vlmrl/config``'s plan and value checks) and the Ray launcher, no module
    derives device, launcher, pools, critic or the estimator's needs from a config: they read the ``RunPlan`` the
    gate computed (``Composed.plan``). The plan the command line composes is the one its values give."""
    import ast

    calls = []
    for path in sorted((REPO / "vlmrl").rglob("*.py")):
        rel = str(path.relative_to(REPO))
        if rel in DERIVING:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in DERIVED:
                    calls.append(f"{rel}:{node.lineno} {name}()")
    assert not calls, "\n".join(calls)

    from vlmrl.config.command import compose

    composed = compose(
        [
            "actor_rollout_ref.model.path=m",
            "data.train_files=t.parquet",
            "trainer.device=cpu",
            "trainer.cpu_workers=2",
            "actor_rollout_ref.hybrid_engine=False",
            "rollout.cpu_workers=1",
            "algorithm.adv_estimator=gae",
        ]
    )
    plan = composed.plan
    assert plan is not None and (plan.device, plan.world, plan.rollout_world) == ("cpu", 2, 1), plan
    assert plan.separate_pools and plan.critic is not None and plan.needs.critic and plan.launcher == "local"
    assert plan.rollout_correction is not None and plan.rollout_correction.rollout_is == "token"  # TIS by default
