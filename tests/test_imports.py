"""The project's modules import each other in one direction: no cycles, and no layer reaching up."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("int8model", "wire", "plan", "hdl", "boards", "sim", "host", "flows", "bench")

# Each package may import only from the layers below it (and itself).
LAYERS = {
    "int8model": 0, "wire": 0,
    "plan": 1,
    "hdl": 2,
    "boards": 3, "sim": 3,
    "host": 4, "flows": 4, "bench": 4,
}
# ``python -m hdl.build`` is the build's entry point, where users find it: a module that only
# hands over to flows.build.
ENTRY_POINTS = {"hdl.build": "flows.build"}


def project_modules():
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def imports_of(name, path, modules):
    """The project modules that ``name`` imports, anywhere in it (a function's import too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            # The module itself, or the package that holds the name imported.
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph():
    modules = project_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def test_the_import_graph_is_read():
    edges = graph()
    assert "plan.plan" in edges["flows.build"] or "plan" in edges["flows.build"]
    assert "hdl.engine" in edges["hdl.top"]
    assert "plan.schedule" in edges["hdl.engine"]


def test_no_import_cycles():
    edges = graph()
    cycles, state = [], {}

    def visit(module, stack):
        state[module] = "open"
        stack.append(module)
        for target in sorted(edges[module]):
            if state.get(target) == "open":
                cycles.append(stack[stack.index(target):] + [target])
            elif target not in state:
                visit(target, stack)
        stack.pop()
        state[module] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module, [])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in cycles)


def test_no_layer_imports_a_higher_one():
    edges = graph()
    upward = []
    for module, targets in edges.items():
        layer = LAYERS[module.split(".")[0]]
        for target in targets:
            if LAYERS[target.split(".")[0]] > layer and ENTRY_POINTS.get(module) != target:
                upward.append(f"{module} -> {target}")
    assert not upward, "imports from a higher layer: " + ", ".join(sorted(upward))


def test_the_ground_floor_imports_no_amaranth():
    """The plan, the model and the wire format are decided before any hardware exists."""
    import subprocess
    import sys
    code = ("import sys, plan, plan.options, plan.contents, wire, int8model; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'amaranth'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_no_module_is_over_500_lines():
    long = {name: len(path.read_text().splitlines()) for name, path in project_modules().items()}
    assert {name: lines for name, lines in long.items() if lines > 500} == {}
