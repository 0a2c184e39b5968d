"""The package's layering by lesson, checked: ``python -m tests.tools.layering``.

Every module of ``minisgl/`` declares the lesson that introduces it with a module-level
constant, read here from the source without importing it::

    __lesson__ = 5

The course's promise is that a learner at lesson N can read every module of lessons 1..N and
meet nothing from a later lesson. So a module of lesson N may import only modules of lessons
<= N, with two kinds of exception:

* **assembly points** (``__lesson__ = "assembly"``): the few places where the lessons are put
  together (the builder that makes an engine from a config, the CLI, the package's front
  door). They may import any lesson; any module may import them.
* **tooling** (``__lesson__ = "tooling"``): benchmarks, test helpers, the demo model's
  training. They may import anything; no lesson module may import them. A module of a package
  whose ``__init__`` declares tooling is tooling unless it declares otherwise.

Imports anywhere in a file count (a function-level import is still a dependency), except
those under ``if TYPE_CHECKING:``. Import circles are reported too, whatever the lessons.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ASSEMBLY = "assembly"
TOOLING = "tooling"


@dataclass(frozen=True)
class Module:
    name: str  # dotted, e.g. "minisgl.scheduler.scheduler"
    path: Path
    lesson: int | str | None  # 1..10, "assembly", "tooling", or None (undeclared)
    imports: frozenset[str]  # dotted names of the minisgl modules it imports


def _declared_lesson(tree: ast.Module) -> int | str | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__lesson__" for t in node.targets):
            if isinstance(node.value, ast.Constant):
                return node.value.value
    return None


def _under_type_checking(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def scan(package_dir: Path) -> dict[str, Module]:
    """Every module of the package at ``package_dir`` (a folder named like the package)."""
    root = package_dir.parent
    names = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    modules = {}
    for name, path in names.items():
        tree = ast.parse(path.read_text(), str(path))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        imported: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and _under_type_checking(node, parents):
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # "from a.b import c": module a.b.c if c is itself a module, else a.b
                targets = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in names else node.module
                           for alias in node.names]
            else:
                continue
            imported.update(t for t in targets if t in names and t != name)
        modules[name] = Module(name, path, _declared_lesson(tree), frozenset(imported))
    for name, mod in modules.items():  # a tooling package's modules are tooling unless they say otherwise
        parent = name.rpartition(".")[0]
        while mod.lesson is None and parent in modules:
            if modules[parent].lesson == TOOLING:
                modules[name] = mod = Module(mod.name, mod.path, TOOLING, mod.imports)
            parent = parent.rpartition(".")[0]
    return modules


def violations(modules: dict[str, Module]) -> list[str]:
    """What breaks the layering: undeclared modules, upward imports, imports of tooling."""
    found = []
    for mod in modules.values():
        if mod.lesson is None or not (mod.lesson in (ASSEMBLY, TOOLING) or isinstance(mod.lesson, int)):
            found.append(f"{mod.name}: no valid __lesson__ (an int 1-10, {ASSEMBLY!r} or {TOOLING!r})")
            continue
        if mod.lesson in (ASSEMBLY, TOOLING):
            continue
        for target in sorted(mod.imports):
            other = modules[target].lesson
            if other == TOOLING:
                found.append(f"{mod.name} (lesson {mod.lesson}) imports tooling module {target}")
            elif isinstance(other, int) and other > mod.lesson:
                found.append(f"{mod.name} (lesson {mod.lesson}) imports {target} (lesson {other})")
    return found


def cycles(modules: dict[str, Module]) -> list[list[str]]:
    """Import circles (strongly connected components of more than one module, or a module
    importing itself), each as a sorted list of module names."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(modules) + 100))

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in modules[v].imports:
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

    for v in sorted(modules):
        if v not in index:
            visit(v)
    return found


def lesson_modules(modules: dict[str, Module], lesson: int) -> list[str]:
    """The modules that declare ``lesson``, sorted."""
    return sorted(m.name for m in modules.values() if m.lesson == lesson)


def check(package_dir: Path) -> list[str]:
    """Every problem found, as readable lines (empty: the layering holds)."""
    modules = scan(package_dir)
    problems = violations(modules)
    problems += [f"import circle: {' -> '.join(c)}" for c in cycles(modules)]
    return problems


def main() -> int:
    package_dir = Path(__file__).resolve().parents[2] / "minisgl"
    problems = check(package_dir)
    modules = scan(package_dir)
    for lesson in range(1, 11):
        print(f"lesson {lesson:2d}: {', '.join(n.removeprefix('minisgl.') for n in lesson_modules(modules, lesson))}")
    for p in problems:
        print("PROBLEM:", p)
    print("layering holds" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
