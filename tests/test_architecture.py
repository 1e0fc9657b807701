"""The architecture, read from the imports (docs/ARCHITECTURE.md): arrows only downward.

Every import of tflfuse/ and device_scripts/ is parsed with `ast`, at module level and inside
functions alike (a lazy import is still a dependency), and importing `tflfuse.a.b.c` counts as
importing the packages `tflfuse.a` and `tflfuse.a.b` too (their __init__ runs first) unless the
importer sits inside them. The checks:
  - no import cycle between modules;
  - each part imports only the parts below it (ALLOWED): e.g. `sources` nothing of `convert`
    (the pipeline asks a source for its data and does the converting);
  - the modules a device bundle ships import, at module level, only each other;
  - TensorFlow, Keras and the quantizer only in the `quantize/` floor, `sources/keras*` and the
    few places TF_ALLOWED names (with the reason), and only lazily, inside functions;
  - device_scripts/ load nothing of rewriting, conversion or TensorFlow;
  - no function or method in tflfuse/ is longer than MAX_FUNCTION_LINES (a longer one is
    several jobs: split it into named helpers);
  - no rule (nor the engine) compares anything with a target's name: what differs per target
    is a trait of its `Target` (tflfuse/targets/registry.py), so a new target needs no edit
    of the rules;
  - no parameter or field below the door is a target's name (`target: str`): `api` and `cli`
    resolve it once, every layer under them takes the `Target`;
  - at most MAX_ANY_SIGNATURES public functions and methods in tflfuse/ have `Any` in their
    signature (an alias of a type that holds `Any` counts as `Any`).
Each failure names the importing file and line and the import itself. The checker is tried on
small synthetic trees with one planted violation each, so a check that cannot fail is caught.
"""

from __future__ import annotations

import ast
import contextlib
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from tflfuse.device.bundle import SHIPPED_MODULES
from tflfuse.targets import TARGETS

REPO = Path(__file__).resolve().parents[1]

# -- the rules -------------------------------------------------------------------------------
BASE = ("errors", "files", "quiet", "resources", "isolation", "version", "json_types")  # below all
# The floors, lowest first: part -> the parts it may import (besides itself and BASE), each of
# them listed before it (test_the_floors_are_in_order). A part is the first name under tflfuse
# (`targets` for tflfuse.targets.edgetpu.rules): a folder, or a module of the doors at the top.
ALLOWED: dict[str, set[str]] = {
    "ir": set(),
    "device": set(),  # interpreter, bench, bundle: what a bundle ships (Python 3.7)
    "rewrite": {"ir"},
    "targets": {"ir", "rewrite", "device"},  # probes ask the interpreter
    "rules": {"ir", "rewrite", "targets", "device"},  # constants fold on the interpreter
    # runs, comparisons, round-off, the per-rewrite check, the verified-apply service
    "verification": {"ir", "rewrite", "device"},
    "deploy": {"ir", "targets", "device"},  # bundles written on the host, sent over SSH
    # quantize, calibration, calibrated ranges, int8 completion: TensorFlow and the quantizer
    "quantize": {"ir", "rewrite", "targets", "rules", "verification", "device"},
    # a source gives models and facts; quantizing, verifying and recipes are convert's
    "sources": {"ir", "rewrite", "rules", "targets", "verification", "device"},
    "convert": {
        "ir",
        "rewrite",
        "rules",
        "targets",
        "verification",
        "quantize",
        "device",
        "sources",
    },
    "examples": set(),
    "api": {"ir", "targets", "verification", "device", "convert"},
    "cli": {
        "ir",
        "rewrite",
        "rules",
        "targets",
        "verification",
        "deploy",
        "quantize",
        "device",
        "sources",
        "convert",
        "examples",
        "api",
    },
    "tflfuse": {"api"},  # the package: its API door, lazily
}
# host-only helpers the device side may reach inside a function (never on the device's path)
DEVICE_HOST_ONLY = {"files", "resources"}
HEAVY = {"tensorflow", "keras", "tf_keras", "litert_quantizer", "ai_edge_quantizer"}
TF_ALLOWED = {  # folder (ending in '.') or module prefix -> why it may import HEAVY (lazily)
    "sources.keras": "the Keras/SavedModel source and its TensorFlow route",
    "quantize.": "quantizing, and decoding calibration images with tf.io",
    "examples.": "the example models are Keras models",
}
# what device scripts never load
NOT_ON_DEVICE = {"rewrite", "rules", "verification", "quantize", "convert", "sources"}
MAX_FUNCTION_LINES = 80  # from `def` to its last line, docstring and comments included


# -- reading the imports -------------------------------------------------------------------------
@dataclass(frozen=True)
class Import:
    importer: str  # module name, e.g. tflfuse.rules.epilogue or device_scripts.deploy
    target: str  # the module it names (tflfuse.*), or the top-level name of another package
    lazy: bool  # inside a function
    where: str  # path:line
    text: str  # the statement
    typing_only: bool = False  # under `if TYPE_CHECKING:`: read by the type checker, never run

    def __str__(self) -> str:
        return f"{self.where}: {self.text}" + ("  (in a function)" if self.lazy else "")


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def read_imports(
    root: Path, folders: tuple[str, ...] = ("tflfuse", "device_scripts")
) -> list[Import]:
    """Every import statement under `folders` of `root`, one Import per module it names."""
    modules = {module_name(root, p) for p in (root / "tflfuse").rglob("*.py")}
    found: list[Import] = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            importer = module_name(root, path)
            tree = ast.parse(path.read_text(), filename=str(path))
            lazy = {
                id(node)
                for func in ast.walk(tree)
                if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef))
                for node in ast.walk(func)
            }
            typing_only = {
                id(node)
                for block in ast.walk(tree)
                if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
                for statement in block.body
                for node in ast.walk(statement)
            }
            for node in ast.walk(tree):
                for target in _targets(node, importer, modules):
                    found.append(
                        Import(
                            importer,
                            target,
                            id(node) in lazy,
                            f"{path.relative_to(root)}:{node.lineno}",
                            ast.unparse(node),
                            id(node) in typing_only,
                        )
                    )
    return list(dict.fromkeys(found))  # one line per import


def _targets(node: ast.AST, importer: str, modules: set[str]) -> list[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:  # relative (tflfuse uses none): against the importer's package
            package = importer.split(".")[: -node.level]
            base = ".".join([*package, base] if base else package)
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    else:
        return []
    out: list[str] = []
    for name in names:
        if not name.startswith("tflfuse"):
            out.append(name.split(".")[0])
            continue
        while name not in modules and "." in name:
            name = name.rpartition(".")[0]
        # importing a.b.c runs a and a.b first: edges to them, unless the importer is inside
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            ancestor = ".".join(parts[:i])
            if ancestor == name or not (importer + ".").startswith(ancestor + "."):
                out.append(ancestor)
    return list(dict.fromkeys(out))


def part_of(module: str) -> str:
    """The part a tflfuse module belongs to (see ALLOWED)."""
    rest = module.removeprefix("tflfuse").removeprefix(".")
    if not rest:
        return "tflfuse"
    head = rest.split(".")[0]
    return "base" if head in BASE else head


def graph_of(imports: list[Import]) -> dict[str, list[Import]]:
    graph: dict[str, list[Import]] = {}
    for imp in imports:
        if imp.target.startswith("tflfuse") and imp.target != imp.importer:
            graph.setdefault(imp.importer, []).append(imp)
    return graph


# -- the checks (each returns its findings, so a planted violation can be asserted) ---------------
def cycles(imports: list[Import]) -> list[str]:
    """Every import cycle, as the chain of imports that closes it."""
    graph = graph_of(imports)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for imp in graph.get(v, []):
            w = imp.target
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
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    found = []
    for component in components:
        members = set(component)
        chain = [str(imp) for v in sorted(members) for imp in graph[v] if imp.target in members]
        found.append(
            "cycle between " + ", ".join(sorted(members)) + ":\n    " + "\n    ".join(chain)
        )
    return list(dict.fromkeys(found))  # one line per import


def upward_imports(imports: list[Import]) -> list[str]:
    """Imports of a part that is not below the importer's part (ALLOWED)."""
    found = []
    for imp in imports:
        if not (imp.importer.startswith("tflfuse") and imp.target.startswith("tflfuse")):
            continue
        mine, theirs = part_of(imp.importer), part_of(imp.target)
        if mine == "base":
            if theirs != "base":
                found.append(f"{imp}: {imp.importer} is below every part")
            continue
        if theirs in ("base", mine) or mine not in ALLOWED:
            continue
        if theirs not in ALLOWED[mine]:
            found.append(f"{imp}: {mine} may not import {theirs}")
    return list(dict.fromkeys(found))  # one line per import


def device_side_imports(imports: list[Import]) -> list[str]:
    """What a shipped module imports outside the bundle: at module level nothing (the device has
    only the bundle); inside a function only the host-only helpers DEVICE_HOST_ONLY."""
    shipped = {
        "tflfuse." + m.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        for m in SHIPPED_MODULES
    } | {"tflfuse"}
    found = []
    for imp in imports:
        if imp.importer not in shipped or not imp.target.startswith("tflfuse"):
            continue
        if imp.target in shipped or imp.typing_only:  # (a type the checker reads: never run)
            continue
        host_only = imp.target.removeprefix("tflfuse.") in DEVICE_HOST_ONLY
        if imp.importer == "tflfuse" and imp.lazy:
            continue  # the package's API door, never opened on a device
        if not (imp.lazy and host_only):
            found.append(f"{imp}: a device bundle does not ship {imp.target}")
    return list(dict.fromkeys(found))  # one line per import


def heavy_imports(imports: list[Import]) -> list[str]:
    """TensorFlow, Keras or the quantizer outside TF_ALLOWED, or at module level anywhere."""
    found = []
    for imp in imports:
        if imp.target not in HEAVY:
            continue
        rest = imp.importer.removeprefix("tflfuse.")
        if not imp.importer.startswith("tflfuse."):
            continue  # device scripts: device_script_loads
        if imp.typing_only and any(rest.startswith(prefix) for prefix in TF_ALLOWED):
            continue  # a Keras or TensorFlow type in an annotation: never imported at run time
        if not any(rest.startswith(prefix) for prefix in TF_ALLOWED):
            found.append(f"{imp}: {imp.target} only in {', '.join(TF_ALLOWED)}")
        elif not imp.lazy:
            found.append(f"{imp}: {imp.target} is imported lazily, inside a function")
    return list(dict.fromkeys(found))  # one line per import


def device_script_loads(imports: list[Import]) -> list[str]:
    """What a device script loads: its own imports and, from each tflfuse module, what that
    module imports at module level (transitively). None of it rewriting, conversion or TF."""
    module_level: dict[str, list[Import]] = {}
    for imp in imports:
        if not imp.lazy and not imp.typing_only:  # (a TYPE_CHECKING import loads nothing)
            module_level.setdefault(imp.importer, []).append(imp)
    found = []
    for script in sorted({i.importer for i in imports if i.importer.startswith("device_scripts")}):
        seen: set[str] = set()
        todo = [(imp, [imp]) for imp in imports if imp.importer == script]
        while todo:
            imp, path = todo.pop()
            target = imp.target
            bad = target in HEAVY or (
                target.startswith("tflfuse") and part_of(target) in NOT_ON_DEVICE
            )
            if bad:
                chain = "\n    ".join(str(i) for i in path)
                found.append(f"{script} loads {target}:\n    {chain}")
                continue
            if target in seen or not target.startswith("tflfuse"):
                continue
            seen.add(target)
            todo += [(nxt, [*path, nxt]) for nxt in module_level.get(target, [])]
    return list(dict.fromkeys(found))  # one line per import


PIPELINES = ("tflfuse.convert.pipeline", "tflfuse.convert.optimize")  # behind api's door


def cli_bypassing_api(imports: list[Import]) -> list[str]:
    """The CLI reaching a conversion pipeline itself: it parses and prints, `api` validates the
    arguments and calls the pipelines (one door, one set of checks)."""
    found = []
    for imp in imports:
        in_cli = imp.importer == "tflfuse.cli" or imp.importer.startswith("tflfuse.cli.")
        if in_cli and imp.target in PIPELINES:
            found.append(f"{imp}: cli must reach {imp.target} through tflfuse.api")
    return list(dict.fromkeys(found))  # one line per import


CHECKS = (
    cycles,
    upward_imports,
    device_side_imports,
    heavy_imports,
    device_script_loads,
    cli_bypassing_api,
)


def long_functions(root: Path) -> list[str]:
    """'path:line: name is N lines' for each function or method under root/tflfuse longer than
    MAX_FUNCTION_LINES (nested ones too; decorators not counted)."""
    found = []
    for path in sorted((root / "tflfuse").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    where = f"{path.relative_to(root)}:{node.lineno}"
                    found.append(f"{where}: {node.name} is {length} lines")
    return found


TARGET_NEUTRAL = ("rules", "rewrite")  # the parts that ask a `Target`, never a name


def _string_literals(node: ast.AST) -> list[str]:
    """The strings a comparison operand spells out: "gpu", or each of ("cpu", "gpu")."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for element in node.elts for s in _string_literals(element)]
    return []


def target_name_branches(root: Path) -> list[str]:
    """'path:line: comparison' for each comparison under root/tflfuse/{rules,rewrite} with a
    target's name as a literal operand (`target == "edgetpu"`, `target in ("xnnpack", "cpu")`)."""
    found = []
    for part in TARGET_NEUTRAL:
        for path in sorted((root / "tflfuse" / part).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if not isinstance(node, ast.Compare):
                    continue
                operands = (node.left, *node.comparators)
                if any(s in TARGETS for o in operands for s in _string_literals(o)):
                    found.append((str(path.relative_to(root)), node.lineno, ast.unparse(node)))
    return [f"{where}:{line}: {text}" for where, line, text in sorted(found)]


def target_names_below_the_door(root: Path) -> list[str]:
    """'path:line: annotation' for each parameter or field under root/tflfuse named `target`
    and annotated as a name only (`str`, `str | None`): the name is resolved once, at the door
    (`api`, `cli`; `Target | str` there), and every layer below takes the `Target`."""
    found = []
    for path in sorted((root / "tflfuse").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.arg):
                name, annotation = node.arg, node.annotation
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                name, annotation = node.target.id, node.annotation
            else:
                continue
            names = _names(annotation)
            if name == "target" and "str" in names and "Target" not in names:
                text = f"{name}: {ast.unparse(annotation)}" if annotation else name
                found.append((str(path.relative_to(root)), node.lineno, text))
    return [f"{where}:{line}: {text}" for where, line, text in sorted(found)]


# Public functions and methods with `Any` in a parameter or the return annotation: what is left
# to type (counted down, never up; the IR's own open dicts, op options and `extra`, stay).
MAX_ANY_SIGNATURES = 1


def _names(node: ast.AST | None) -> set[str]:
    """The names an annotation mentions (`typing.Any` as "Any"; string annotations read too)."""
    found: set[str] = set()
    for n in ast.walk(node) if node is not None else ():
        if isinstance(n, ast.Name):
            found.add(n.id)
        elif isinstance(n, ast.Attribute) and n.attr == "Any":
            found.add("Any")
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and len(n.value) < 200:
            with contextlib.suppress(SyntaxError):  # (a string that is no annotation)
                found |= _names(ast.parse(n.value, mode="eval"))
    return found


def _any_aliases(trees: list[ast.Module]) -> set[str]:
    """`Any`, and every module-level name bound to a type that mentions it (`X = dict[str, Any]`,
    `X: TypeAlias = ...`, `type X = ...`), through aliases of aliases."""
    bound: dict[str, set[str]] = {}
    for tree in trees:
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                target, value = node.target, node.value
            elif isinstance(node, getattr(ast, "TypeAlias", ())):  # `type X = ...` (3.12)
                target, value = node.name, node.value
            else:
                continue
            if isinstance(target, ast.Name):
                bound.setdefault(target.id, set()).update(_names(value))
    names = {"Any"}
    while grown := {k for k, refs in bound.items() if k not in names and refs & names}:
        names |= grown
    return names


def any_signatures(root: Path) -> list[str]:
    """'path:line: Class.name' for each public function or method (its name, and its class's, not
    starting with '_') under root/tflfuse whose parameters or return mention `Any`."""
    paths = sorted((root / "tflfuse").rglob("*.py"))
    trees = [ast.parse(p.read_text(), filename=str(p)) for p in paths]
    names = _any_aliases(trees)
    found = []

    def visit(body: list[ast.stmt], where: str, prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                visit(node.body, where, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
                annotations = [p.annotation for p in params if p is not None] + [node.returns]
                if not node.name.startswith("_") and any(_names(t) & names for t in annotations):
                    found.append(f"{where}:{node.lineno}: {prefix}{node.name}")

    for path, tree in zip(paths, trees):
        visit(tree.body, str(path.relative_to(root)), "")
    return found


# -- the project ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def project() -> list[Import]:
    return read_imports(REPO)


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_the_project_keeps_its_layering(project: list[Import], check) -> None:
    findings = check(project)
    assert not findings, "\n".join(findings)


def test_no_function_is_longer_than_the_limit() -> None:
    findings = long_functions(REPO)
    assert not findings, "\n".join(findings)


def test_no_rule_branches_on_a_target_name() -> None:
    findings = target_name_branches(REPO)
    assert not findings, "ask the target's trait in tflfuse/targets/registry.py:\n" + "\n".join(
        findings
    )


def test_no_layer_below_the_door_takes_a_target_name() -> None:
    findings = target_names_below_the_door(REPO)
    assert not findings, "take the `Target` (tflfuse.targets.target(name) at the door):\n" + (
        "\n".join(findings)
    )


def test_the_target_name_annotation_check_finds_planted_ones(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "tflfuse/rules/a.py": """\
                from dataclasses import dataclass

                def door(target: "Target | str") -> None: ...
                def below(x: int, target: str | None = None) -> None: ...
                @dataclass
                class Record:
                    target: str
                    target_name: str
                """
        },
    )
    assert target_names_below_the_door(tmp_path) == [
        "tflfuse/rules/a.py:4: target: str | None",
        "tflfuse/rules/a.py:7: target: str",
    ]


def test_few_public_signatures_have_any() -> None:
    findings = any_signatures(REPO)
    assert len(findings) <= MAX_ANY_SIGNATURES, (
        f"{len(findings)} public signatures with Any, more than {MAX_ANY_SIGNATURES}: type the"
        " new one (a dataclass, TypedDict, Protocol, NDArray...):\n" + "\n".join(findings)
    )


def test_the_any_count_finds_planted_signatures(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "tflfuse/ir/a.py": textwrap.dedent(
                """\
                import typing
                from typing import Any

                Row = dict[str, Any]
                Rows = list[Row]  # an alias of an alias

                def typed(x: int) -> dict[str, int]: ...
                def _private(x: Any) -> Any: ...
                def param(x: "list[Any]") -> None: ...
                def returned(*, y: int) -> typing.Any: ...
                def rows(**kw: int) -> Rows: ...
                class C:
                    def method(self, *args: Any) -> None: ...
                    def _helper(self) -> Any: ...
                class _Hidden:
                    def method(self) -> Any: ...
                """
            )
        },
    )
    assert any_signatures(tmp_path) == [
        "tflfuse/ir/a.py:9: param",
        "tflfuse/ir/a.py:10: returned",
        "tflfuse/ir/a.py:11: rows",
        "tflfuse/ir/a.py:13: C.method",
    ]


def test_the_target_name_check_finds_a_planted_branch(tmp_path: Path) -> None:
    rules = tmp_path / "tflfuse" / "rules"
    rules.mkdir(parents=True)
    (tmp_path / "tflfuse" / "rewrite").mkdir()
    (rules / "fuse.py").write_text(
        textwrap.dedent(
            """\
            def limit(target="xnnpack", kind="cpu-float"):  # a default is no branch
                if kind == "int8" or target is None:
                    return None
                return 3 if target == "edgetpu" else None

            def pays(target):
                return target in ("xnnpack", "cpu")
            """
        )
    )
    assert target_name_branches(tmp_path) == [
        "tflfuse/rules/fuse.py:4: target == 'edgetpu'",
        "tflfuse/rules/fuse.py:7: target in ('xnnpack', 'cpu')",
    ]


def test_the_length_check_finds_a_planted_long_function(tmp_path: Path) -> None:
    def lines(indent: str, n: int) -> str:
        return "".join(f"{indent}x{i} = {i}\n" for i in range(n))

    _tree(
        tmp_path,
        {  # def line + body: exactly the limit, then one line more (a method)
            "tflfuse/ir/fits.py": "def fits():\n" + lines("    ", MAX_FUNCTION_LINES - 1),
            "tflfuse/ir/long.py": "class C:\n    def long(self):\n"
            + lines("        ", MAX_FUNCTION_LINES),
        },
    )
    assert long_functions(tmp_path) == [
        f"tflfuse/ir/long.py:2: long is {MAX_FUNCTION_LINES + 1} lines"
    ]


def test_the_floors_are_in_order() -> None:
    """Each part may import only parts listed before it in ALLOWED: the floors form one order
    (two parts that may import each other would be one floor)."""
    order = list(ALLOWED)
    late = {
        part: sorted(p for p in below if order.index(p) > order.index(part))
        for part, below in ALLOWED.items()
    }
    assert not {k: v for k, v in late.items() if v}, late


def test_every_module_belongs_to_a_part(project: list[Import]) -> None:
    modules = {module_name(REPO, p) for p in (REPO / "tflfuse").rglob("*.py")}
    unknown = {m for m in modules if part_of(m) not in {*ALLOWED, "base"}}
    assert not unknown, f"modules in no part of ALLOWED: {sorted(unknown)}"
    assert len(project) > 300  # the reader found the imports (all of them are counted)


# -- the checker, on planted violations ----------------------------------------------------------
def _tree(tmp_path: Path, files: dict[str, str]) -> list[Import]:
    for rel, source in {"tflfuse/__init__.py": "", **files}.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    for rel in list(files):
        for parent in Path(rel).parents:
            init = tmp_path / parent / "__init__.py"
            if parent.parts and parent.parts[0] == "tflfuse" and not init.exists():
                init.write_text("")
    (tmp_path / "device_scripts").mkdir(exist_ok=True)
    return read_imports(tmp_path)


CLEAN = {
    "tflfuse/errors.py": "class TflfuseError(Exception): ...\n",
    "tflfuse/ir/graph.py": "from tflfuse.errors import TflfuseError\n",
    "tflfuse/rewrite/engine.py": "from tflfuse.ir.graph import TflfuseError\n",
    "tflfuse/rules/fuse.py": "from tflfuse.rewrite import engine\nfrom tflfuse.targets import x\n",
    "tflfuse/targets/x.py": "from tflfuse.ir import graph\n",
    "tflfuse/sources/keras.py": "if TYPE_CHECKING:\n    import tensorflow as tf\n"  # (a type)
    "def load():\n    import tensorflow as tf\n",
    "tflfuse/device/bench.py": "from tflfuse.device import interpreter\n",
    "tflfuse/device/interpreter.py": "from tflfuse.errors import TflfuseError\n"
    "if TYPE_CHECKING:\n    from tflfuse.json_types import JSON\n",  # (never run: not shipped)
    "tflfuse/json_types.py": "JSON = object\n",
    "device_scripts/run.py": "from tflfuse.device import bench\n",
}
PLANTED = [
    (  # a cycle through imports hidden in functions
        {
            "tflfuse/targets/x.py": "def f():\n    from tflfuse.targets import y\n",
            "tflfuse/targets/y.py": "from tflfuse.targets.x import f\n",
        },
        cycles,
        "tflfuse/targets/x.py:2: from tflfuse.targets import y  (in a function)",
    ),
    (  # a cycle through a package __init__ (importing a.b runs a first)
        {
            "tflfuse/targets/__init__.py": "from tflfuse.targets.x import f\n",
            "tflfuse/targets/x.py": "from tflfuse.rules import fuse\n",
            "tflfuse/rules/fuse.py": "from tflfuse.targets.y import g\n",
            "tflfuse/targets/y.py": "g = 1\n",
        },
        cycles,
        "tflfuse/rules/fuse.py:1: from tflfuse.targets.y import g",
    ),
    (  # the IR importing the engine above it
        {"tflfuse/ir/graph.py": "def f():\n    from tflfuse.rewrite.engine import run\n"},
        upward_imports,
        "ir may not import rewrite",
    ),
    (  # a rule importing the conversion pipeline
        {
            "tflfuse/rules/fuse.py": "from tflfuse.convert import report\n",
            "tflfuse/convert/report.py": "",
        },
        upward_imports,
        "rules may not import convert",
    ),
    (  # a rule importing a source
        {
            "tflfuse/rules/fuse.py": "from tflfuse.sources import keras\n",
            "tflfuse/sources/keras.py": "",
        },
        upward_imports,
        "rules may not import sources",
    ),
    (  # the targets importing the rules
        {
            "tflfuse/targets/x.py": "from tflfuse.rules.fuse import Fuse\n",
            "tflfuse/rules/fuse.py": "",
        },
        upward_imports,
        "targets may not import rules",
    ),
    (  # the device floor reaching up to a target, even lazily (targets/probe points down)
        {"tflfuse/device/bench.py": "def f():\n    from tflfuse.targets import x\n"},
        upward_imports,
        "device may not import targets",
    ),
    (  # the verification floor reaching up to the quantizer
        {
            "tflfuse/verification/verify.py": "from tflfuse.quantize import quantize\n",
            "tflfuse/quantize/quantize.py": "",
        },
        upward_imports,
        "verification may not import quantize",
    ),
    (  # the device runtime importing the IR at module level
        {"tflfuse/device/bench.py": "from tflfuse.ir import graph\n"},
        device_side_imports,
        "a device bundle does not ship tflfuse.ir",
    ),
    (  # TensorFlow below the sources
        {"tflfuse/targets/x.py": "def f():\n    import tensorflow\n"},
        heavy_imports,
        "tflfuse/targets/x.py:2: import tensorflow  (in a function): tensorflow only in",
    ),
    (  # a TensorFlow type where TensorFlow is not allowed at all
        {"tflfuse/targets/x.py": "if TYPE_CHECKING:\n    import tensorflow\n"},
        heavy_imports,
        "tflfuse/targets/x.py:2: import tensorflow: tensorflow only in",
    ),
    (  # the quantizer at module level, even where it is allowed
        {"tflfuse/quantize/quantize.py": "from litert_quantizer import quantizer\n"},
        heavy_imports,
        "litert_quantizer is imported lazily",
    ),
    (  # a device script that loads the rewrite engine through a module it imports
        {
            "tflfuse/deploy/deploy.py": "from tflfuse.rewrite import engine\n",
            "device_scripts/run.py": "def main():\n    from tflfuse.deploy import deploy\n",
        },
        device_script_loads,
        "device_scripts.run loads tflfuse.rewrite",
    ),
    (  # the CLI calling the optimize pipeline itself, beside the API
        {
            "tflfuse/cli/__init__.py": "def run():\n    from tflfuse.convert.optimize import run\n",
            "tflfuse/convert/optimize.py": "",
        },
        cli_bypassing_api,
        "tflfuse/cli/__init__.py:2: from tflfuse.convert.optimize import run  (in a function)",
    ),
    (  # ... or from one of its command modules
        {
            "tflfuse/cli/optimize.py": "from tflfuse.convert.pipeline import convert\n",
            "tflfuse/convert/pipeline.py": "",
        },
        cli_bypassing_api,
        "tflfuse/cli/optimize.py:1: from tflfuse.convert.pipeline import convert:",
    ),
]


def test_a_clean_synthetic_tree_passes_every_check(tmp_path: Path) -> None:
    imports = _tree(tmp_path, CLEAN)
    assert any(i.target == "tensorflow" and i.lazy for i in imports)  # read inside functions
    for check in CHECKS:
        assert check(imports) == [], check.__name__


@pytest.mark.parametrize(
    ("files", "check", "message"),
    PLANTED,
    ids=[f"{c.__name__}-{i}" for i, (_, c, _) in enumerate(PLANTED)],
)
def test_a_planted_violation_fails_and_names_the_import(
    tmp_path: Path, files: dict[str, str], check, message: str
) -> None:
    findings = check(_tree(tmp_path, {**CLEAN, **files}))
    assert findings, f"{check.__name__} missed the planted violation"
    assert any(message in f for f in findings), findings
