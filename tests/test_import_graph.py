"""The package's import graph: layers import only downward (docs/architecture.md).

Every `import` of the package's own modules counts, at module level or inside a function (an import
inside a function is still a dependency; it only hides it until the function runs). `if TYPE_CHECKING:`
blocks and `__main__.py` entry points are left out: neither is imported by anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "niels_gpt"
LAZY = "# lazy:"


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unit(module: str) -> str:
    """The layer a module belongs to: a subpackage, or a top-level module of its own."""
    return ".".join(module.split(".")[:2])


def _imports(path: Path):
    """(imported module, line, inside a function, the lines above it) for each import of the package."""
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    here = _module(path).split(".")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here if path.name == "__init__.py" else here[:-1]
                base = base[: len(base) - node.level + 1]
                targets = [".".join(base + ([node.module] if node.module else []))]
            else:
                targets = [node.module or ""]
        else:
            continue
        in_function = type_checking = False
        up = node
        while up in parents:
            up = parents[up]
            in_function |= isinstance(up, ast.FunctionDef | ast.AsyncFunctionDef)
            type_checking |= isinstance(up, ast.If) and "TYPE_CHECKING" in ast.unparse(up.test)
        if type_checking:
            continue
        for target in targets:
            if target == "niels_gpt" or target.startswith("niels_gpt."):
                yield target, node.lineno, in_function, lines[max(0, node.lineno - 3): node.lineno]


def _sources():
    return [p for p in sorted(PACKAGE.rglob("*.py")) if p.name != "__main__.py"]


def _graph() -> dict[str, dict[str, list[str]]]:
    edges: dict[str, dict[str, list[str]]] = {}
    for path in _sources():
        unit = _unit(_module(path))
        edges.setdefault(unit, {})
        for target, line, _, _ in _imports(path):
            other = _unit(target)
            if other != unit and other != "niels_gpt":  # `from niels_gpt import x` names x's own unit below
                edges[unit].setdefault(other, []).append(f"{path.relative_to(PACKAGE.parent)}:{line}")
    # `from niels_gpt import sources` imports niels_gpt.sources: count it as that unit
    for path in _sources():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "niels_gpt" and not node.level:
                for alias in node.names:
                    other = f"niels_gpt.{alias.name}"
                    if other != _unit(_module(path)):
                        edges[_unit(_module(path))].setdefault(other, []).append(
                            f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    return edges


def _cycles(edges: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """Strongly connected components of more than one unit (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_between_packages():
    edges = _graph()
    problems = []
    for component in _cycles(edges):
        inside = [f"  {a} -> {b} ({', '.join(where[:3])})" for a in component for b, where in edges[a].items()
                  if b in component]
        problems.append("cycle: " + " <-> ".join(component) + "\n" + "\n".join(inside))
    assert not problems, "\n".join(problems)


def test_the_contract_facade_is_imported_by_no_layer():
    """niels_gpt.cache holds the contract's import paths only; the code lives in the layers below."""
    users = {unit: where for unit, targets in _graph().items() for t, where in targets.items()
             if t == "niels_gpt.cache" and unit != "niels_gpt.cache"}
    assert not users, users


def test_imports_inside_functions_say_why():
    unexplained = []
    for path in _sources():
        for target, line, in_function, above in _imports(path):
            if in_function and not any(LAZY in text for text in above):
                unexplained.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}")
    assert not unexplained, (f"imports of the package inside a function need a `{LAZY} <why>` comment on the "
                             "line above (or move them to the top of the module):\n" + "\n".join(unexplained))


def test_the_graph_check_can_fail():
    """The cycle finder finds a cycle when there is one, and the scan sees imports inside functions."""
    assert _cycles({"a": {"b": []}, "b": {"c": []}, "c": {"a": []}, "d": {"a": []}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b": []}, "b": {}}) == []
    lazy = [(t, fn) for t, _, fn, _ in _imports(PACKAGE / "tokenizer" / "base.py") if fn]
    assert lazy and all(fn for _, fn in lazy)


@pytest.mark.parametrize("path", [PACKAGE / "cache" / f"{name}.py" for name in
                                  ("build_cache", "formats", "meta", "mmap", "pretrain_dataset", "sft_dataset", "cli")])
def test_contract_paths_are_thin_facades(path):
    """Each contract module re-exports the module where its code lives and defines nothing of its own."""
    tree = ast.parse(path.read_text())
    defined = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef | ast.Assign)]
    assert not defined, f"{path.name} defines {[getattr(n, 'name', ast.unparse(n)) for n in defined]}"


def test_every_package_directory_is_a_package():
    """A directory of modules without __init__.py imports from a checkout but is left out of a wheel
    (setuptools' packages.find): every one has its __init__.py."""
    missing = sorted(str(d.relative_to(PACKAGE.parent)) for d in {p.parent for p in PACKAGE.rglob("*.py")}
                     if not (d / "__init__.py").is_file())
    assert not missing, missing


def test_no_package_file_is_hidden_by_the_ignore_patterns():
    """Tools that honour .gitignore (linters, indexers, code search) must see every module: a package
    named after a common ignore pattern (`build/`, `dist/`, `cache/`) would vanish from them."""
    import shutil
    import subprocess

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    modules = [p.relative_to(PACKAGE.parent).as_posix() for p in _sources()]
    r = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], input="\n".join(modules), text=True,
                       capture_output=True, cwd=PACKAGE.parent)
    if r.returncode not in (0, 1):
        pytest.skip(f"not a git checkout ({r.stderr.strip()})")
    assert r.stdout.split() == [], "ignored by .gitignore"


def test_the_ignore_check_can_fail(tmp_path):
    import shutil
    import subprocess

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("build/\n")
    r = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], input="pkg/build/x.py\npkg/ok.py",
                       text=True, capture_output=True, cwd=tmp_path)
    assert r.stdout.split() == ["pkg/build/x.py"]


MAX_MODULE_LINES = 400  # STYLE.md: a file past ~400 lines is asking to be split by concept


def test_no_module_is_over_four_hundred_lines():
    long = {p.relative_to(PACKAGE.parent).as_posix(): n for p in _sources()
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them along their concerns): {long}"


# The package's size at 0.6.0 (24,715 lines of Python, wc -l), with a little room: a change that adds more
# replaces something, or raises this number in the same commit and says why in CHANGELOG.md (25,000 -> 25,100:
# SFT rendering with the fast encoder and the split draws without torch; -> 25,150: `pack-sft` and `trace --help`
# without torch).
MAX_PACKAGE_LINES = 25_251


def test_the_package_does_not_grow_back():
    sizes: dict[str, int] = {}
    for p in PACKAGE.rglob("*.py"):
        part = p.relative_to(PACKAGE).parts[0] if len(p.relative_to(PACKAGE).parts) > 1 else "(top level)"
        sizes[part] = sizes.get(part, 0) + len(p.read_text().splitlines())
    total = sum(sizes.values())
    biggest = ", ".join(f"{k} {v:,}" for k, v in sorted(sizes.items(), key=lambda kv: -kv[1])[:5])
    assert total <= MAX_PACKAGE_LINES, (f"niels_gpt/ is {total:,} lines of Python, over {MAX_PACKAGE_LINES:,} "
                                        f"(largest: {biggest}): replace rather than add, or raise the limit "
                                        "with a reason in CHANGELOG.md")
