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

At run time too: with the settings that switch off the lessons after N (:data:`LESSON_SETTINGS`,
lessons 4-8), an offline generate in a fresh interpreter loads no module of a later lesson (the
builder imports a later lesson in the branch that uses it).
"""

from __future__ import annotations

import ast
import os
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


# --- At run time: a lesson's settings load no later lesson ------------------------------------

# The engine settings that switch off every lesson after N (the offline LLM on the CPU, one rank):
# lesson 5 turns the radix cache on, 6 chunked prefill, 7 overlap, 8 the graph runner.
LESSON_SETTINGS: dict[int, dict] = {
    4: dict(prefix_cache=False, chunked_prefill_size=None, overlap=False, cuda_graph_max_bs=0),
    5: dict(prefix_cache=True, chunked_prefill_size=None, overlap=False, cuda_graph_max_bs=0),
    6: dict(prefix_cache=True, chunked_prefill_size=8, overlap=False, cuda_graph_max_bs=0),
    7: dict(prefix_cache=True, chunked_prefill_size=8, overlap=True, cuda_graph_max_bs=0),
    8: dict(prefix_cache=True, chunked_prefill_size=8, overlap=True, cuda_graph_max_bs=4),
}

_RUNTIME_PROBE = """
import json, sys
from minisgl.testing import tiny_checkpoint
path = tiny_checkpoint("qwen3")
from minisgl import LLM, SamplingParams
llm = LLM(path, device="cpu", **json.loads(sys.argv[1]))
outs = llm.generate(["The cat sat on", "One two three four five six seven eight nine ten"],
                    SamplingParams(temperature=0, max_tokens=6), progress=False)
assert all(len(o.token_ids) == 6 for o in outs), outs
print(json.dumps(sorted(m for m in sys.modules if m == "minisgl" or m.startswith("minisgl."))))
"""


def modules_loaded_by_generate(lesson: int) -> list[str]:
    """The ``minisgl`` modules in ``sys.modules`` after an offline generate (two prompts, greedy,
    on a tiny Qwen3 on the CPU) with lesson ``lesson``'s settings, in a fresh process."""
    return modules_loaded_by_generates([lesson])[lesson]


def modules_loaded_by_generates(lessons: list[int], parallel: int = 1) -> dict[int, list[str]]:
    """:func:`modules_loaded_by_generate` for several lessons: each in a fresh process forked
    from one interpreter that imported torch and transformers once (and nothing of ``minisgl``:
    :mod:`tests.tools.forkrun`), ``parallel`` at a time."""
    import json

    from tests.tools.forkrun import Run, run_forked

    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1")
    runs = [Run(["-c", _RUNTIME_PROBE, json.dumps(LESSON_SETTINGS[lesson])]) for lesson in lessons]
    out = {}
    for lesson, result in zip(lessons, run_forked(runs, preload=("torch", "transformers"), parallel=parallel, env=env)):
        if result.returncode != 0:
            raise RuntimeError(f"the lesson-{lesson} generate failed:\n{result.stderr[-3000:]}")
        out[lesson] = json.loads(result.output.strip().splitlines()[-1])
    return out


def runtime_violations(modules: dict[str, Module], lesson: int, loaded: list[str]) -> list[str]:
    """The loaded modules that belong to a lesson after ``lesson``, as readable lines."""
    return [f"lesson-{lesson} settings loaded {name} (lesson {modules[name].lesson})" for name in loaded
            if name in modules and isinstance(modules[name].lesson, int) and modules[name].lesson > lesson]


def main() -> int:
    package_dir = Path(__file__).resolve().parents[2] / "minisgl"
    problems = check(package_dir)
    modules = scan(package_dir)
    for lesson in sorted({m.lesson for m in modules.values() if isinstance(m.lesson, int)}):
        print(f"lesson {lesson:2d}: {', '.join(n.removeprefix('minisgl.') for n in lesson_modules(modules, lesson))}")
    runs = modules_loaded_by_generates(list(LESSON_SETTINGS), parallel=2)
    for lesson, loaded in runs.items():
        found = runtime_violations(modules, lesson, loaded)
        print(f"lesson {lesson:2d} settings: a generate loads {len(loaded)} minisgl modules"
              + (f", {len(found)} of later lessons" if found else ", none of a later lesson"))
        problems += found
    for p in problems:
        print("PROBLEM:", p)
    print("layering holds" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
