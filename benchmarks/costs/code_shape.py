"""The code's shape, counted: what a reviewer asks of a tree before reading it.

For a tree (default ``tunectl/``) it counts and lists:

- modules over 400 lines (every line of the file);
- functions over 40 lines: the body from its first statement after the docstring to its last line,
  blank lines and comments inside included; a nested function counts on its own and inside its parent;
- result rows read by field name: a subscript whose key is a string constant naming a field of the
  ``Record`` dataclass (found in the tree by its source, so an older tree uses its own fields), read
  or written, such as ``row["median_us"]``; a record read by attribute (``record.median_us``) is not;
- imports that run back up the ``layers`` contract of the import-linter settings in the tree's
  ``pyproject.toml``: an import statement (at module level or inside a function) in a module of one
  layer naming a module of a higher layer. Modules of no layer are not counted;
- ``# fmt: skip`` comments outside kernel files (a kernel file defines a ``@triton.jit`` function):
  limits are met at seams, not by switching the formatter off.

``--check`` exits 1 where this checkout's tree has a module over 400 lines, a function over 40 lines
or a ``# fmt: skip`` outside a kernel file (the limits CI can hold a tree to).

``--ref GIT_REF`` measures that commit too (its tree and its own ``pyproject.toml``, unpacked with
``git archive`` into a temporary folder) and prints the two side by side, the ref first, then this
checkout's working tree.

    python benchmarks/costs/code_shape.py [TREE] [--ref GIT_REF] [--check]
"""

from __future__ import annotations

import argparse
import ast
import io
import subprocess
import sys
import tarfile
import tempfile
import tokenize
import tomllib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 40


class ShapeError(Exception):
    """Input the tool cannot measure (a missing tree, an unknown ref, a malformed contract)."""


@dataclass
class Shape:
    """What one tree measured: each list holds one line per finding."""

    label: str
    contract: str
    long_modules: list[str] = field(default_factory=list)
    long_functions: list[str] = field(default_factory=list)
    row_subscripts: list[str] = field(default_factory=list)
    upward_imports: list[str] = field(default_factory=list)
    format_skips: list[str] = field(default_factory=list)

    def over_limits(self) -> bool:
        """Whether the tree breaks a limit ``--check`` holds it to."""
        return bool(self.long_modules or self.long_functions or self.format_skips)


MEASURES = (
    (f"modules over {MAX_MODULE_LINES} lines", "long_modules"),
    (f"functions over {MAX_FUNCTION_LINES} lines", "long_functions"),
    ("result rows read by field name", "row_subscripts"),
    ("imports up the layers", "upward_imports"),
    ("`# fmt: skip` outside kernel files", "format_skips"),
)


def measure(root: Path, tree: str, *, label: str) -> Shape:
    """The shape of ``root / tree``, with the layers contract of ``root / pyproject.toml``."""
    base = root / tree
    if not base.is_dir():
        raise ShapeError(f"no folder {tree} under {root}")
    sources = {path: path.read_text(encoding="utf-8") for path in sorted(base.rglob("*.py"))}
    parsed = {path: ast.parse(text, filename=str(path)) for path, text in sources.items()}
    contract, layers = read_layers(root / "pyproject.toml")
    fields = record_fields(ast.parse(p.read_bytes()) for p in sorted((root / "tunectl").rglob("record.py")))
    modules = {module_name(root, path): path for path in parsed}
    shape = Shape(label=label, contract=contract)
    for path, module in parsed.items():
        where = path.relative_to(root).as_posix()
        num_lines = len(sources[path].splitlines())
        if num_lines > MAX_MODULE_LINES:
            shape.long_modules.append(f"{where}: {num_lines}")
        shape.long_functions += [f"{where}:{line} {name}: {n}" for line, name, n in long_functions(module)]
        shape.row_subscripts += [f"{where}:{line} {text}" for line, text in row_subscripts(module, fields)]
        if not is_kernel_file(module):
            shape.format_skips += [f"{where}:{line}" for line in format_skips(sources[path])]
        name = module_name(root, path)
        is_package = path.name == "__init__.py"
        for line, target in imports_of(module, name, is_package=is_package, modules=modules):
            ranks = layer_of(name, layers), layer_of(target, layers)
            if ranks[0] is not None and ranks[1] is not None and ranks[1] < ranks[0]:
                shape.upward_imports.append(f"{where}:{line} {name} -> {target}")
    return shape


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def read_layers(pyproject: Path) -> tuple[str, list[tuple[str, ...]]]:
    """The layers contract's name and its layers, highest first, each as its module names."""
    try:
        settings = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ShapeError(f"cannot read {pyproject}: {exc}") from None
    contracts = settings.get("tool", {}).get("importlinter", {}).get("contracts", [])
    found = [c for c in contracts if c.get("type") == "layers"]
    if len(found) != 1:
        raise ShapeError(f"{pyproject} has {len(found)} layers contracts, not one")
    layers = []
    for layer in found[0].get("layers", []):
        names = layer.replace(":", "|").split("|")
        layers.append(tuple(n.strip() for n in names if n.strip()))
    return str(found[0].get("name", "layers")), layers


def layer_of(module: str, layers: Sequence[tuple[str, ...]]) -> int | None:
    """The index of the layer ``module`` belongs to (0 is the highest), by its longest named prefix."""
    best: tuple[int, int] | None = None
    for rank, names in enumerate(layers):
        for name in names:
            if (module == name or module.startswith(name + ".")) and (best is None or len(name) > best[0]):
                best = (len(name), rank)
    return None if best is None else best[1]


def record_fields(modules: Iterable[ast.Module]) -> frozenset[str]:
    """The field names of the first ``Record`` dataclass among ``modules`` (annotated names in its body)."""
    for module in modules:
        for node in module.body:
            if isinstance(node, ast.ClassDef) and node.name == "Record" and _is_dataclass(node):
                return frozenset(
                    s.target.id
                    for s in node.body
                    if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                )
    raise ShapeError("no record.py under tunectl/ defines a Record dataclass")


def _is_dataclass(node: ast.ClassDef) -> bool:
    for deco in node.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        if ast.unparse(target).split(".")[-1] == "dataclass":
            return True
    return False


def long_functions(module: ast.Module) -> list[tuple[int, str, int]]:
    """(line, qualified name, body lines) of each function whose body is over the limit."""
    out = []
    for node, qualname in _functions(module, ""):
        body = node.body
        if ast.get_docstring(node) is not None:
            body = body[1:]
        if not body:
            continue
        end = node.end_lineno or body[-1].lineno
        num_lines = end - body[0].lineno + 1
        if num_lines > MAX_FUNCTION_LINES:
            out.append((node.lineno, qualname, num_lines))
    return out


def _functions(node: ast.AST, prefix: str) -> Iterator[tuple[ast.FunctionDef | ast.AsyncFunctionDef, str]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            yield child, prefix + child.name
            yield from _functions(child, prefix + child.name + ".")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, prefix + child.name + ".")
        else:
            yield from _functions(child, prefix)


def is_kernel_file(module: ast.Module) -> bool:
    """Whether the module defines a kernel: a function decorated ``@triton.jit`` (or ``@jit``)."""
    for node in ast.walk(module):
        if isinstance(node, ast.FunctionDef):
            for deco in node.decorator_list:
                target = deco.func if isinstance(deco, ast.Call) else deco
                if ast.unparse(target).split(".")[-1] == "jit":
                    return True
    return False


def format_skips(source: str) -> list[int]:
    """The lines of ``# fmt: skip`` comments (comments only: not the words inside a string)."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return [t.start[0] for t in tokens if t.type == tokenize.COMMENT and t.string.strip() == "# fmt: skip"]


def row_subscripts(module: ast.Module, fields: frozenset[str]) -> list[tuple[int, str]]:
    """(line, source) of each access by field name to what the module uses as a result row.

    An access is ``x["name"]`` or ``x.get("name", ...)`` with a string constant; ``x`` (by its source
    text) is a row in this module when it is accessed here by two or more names and every one is a
    record field, so a settings dict or a bundle entry that shares a field name with records is not
    one. A container read by one name only is not counted: the count is a floor.
    """
    by_base: dict[str, list[tuple[int, str, str]]] = {}
    for node in ast.walk(module):
        if not isinstance(node, ast.Subscript | ast.Call):
            continue
        found = _keyed_access(node)
        if found is not None:
            base, key = found
            by_base.setdefault(ast.unparse(base), []).append((node.lineno, key, ast.unparse(node)))
    rows = [
        (line, text)
        for accesses in by_base.values()
        if len({key for _, key, _ in accesses}) > 1 and all(key in fields for _, key, _ in accesses)
        for line, _, text in accesses
    ]
    return sorted(rows)


def _keyed_access(node: ast.Subscript | ast.Call) -> tuple[ast.expr, str] | None:
    """(the container, the key) of ``x["key"]`` or ``x.get("key", ...)``; None for anything else."""
    if isinstance(node, ast.Subscript):
        key: ast.expr = node.slice
        base = node.value
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and node.args
    ):
        key, base = node.args[0], node.func.value
    else:
        return None
    if isinstance(key, ast.Constant) and isinstance(key.value, str):
        return base, key.value
    return None


def imports_of(
    module: ast.Module, name: str, *, is_package: bool, modules: dict[str, Path]
) -> list[tuple[int, str]]:
    """(line, module imported) for every import in the module, function bodies included.

    ``from a import b`` names ``a.b`` where that is a module of the tree, else ``a``; relative imports
    resolve against the importing module's package.
    """
    package = name if is_package else name.rpartition(".")[0]
    out = []
    for node in ast.walk(module):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, package)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.append((node.lineno, sub if sub in modules else base))
    return out


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join([*parts, node.module] if node.module else parts)


def measure_ref(repo: Path, ref: str, tree: str) -> Shape:
    """The shape of ``tree`` at commit ``ref``, unpacked from ``git archive`` into a temporary folder."""
    commit = _git(repo, "rev-parse", "--short", "--verify", "--quiet", f"{ref}^{{commit}}").decode().strip()
    archive = _git(repo, "archive", "--format=tar", commit, "--", "pyproject.toml", "tunectl", tree)
    with (
        tempfile.TemporaryDirectory(prefix="code-shape-") as folder,
        tarfile.open(fileobj=io.BytesIO(archive)) as tar,
    ):
        tar.extractall(folder, filter="data")
        label = commit if commit.startswith(ref) else f"{ref} ({commit})"
        return measure(Path(folder), tree, label=label)


def _git(repo: Path, *args: str) -> bytes:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True)
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        raise ShapeError(f"git {args[0]} failed: {said[-1] if said else 'no such ref'}")
    return done.stdout


def working_label(repo: Path) -> str:
    head = _git(repo, "rev-parse", "--short", "HEAD").decode().strip()
    dirty = _git(repo, "status", "--porcelain", "--untracked-files=no").strip()
    return f"working tree (HEAD {head}{', with changes' if dirty else ''})"


def report(shapes: Sequence[Shape]) -> str:
    """A Markdown table of the counts, one column per shape, then each shape's findings."""
    lines = [
        "| measure | " + " | ".join(s.label for s in shapes) + " |",
        "|---|" + "---:|" * len(shapes),
    ]
    for title, attr in MEASURES:
        lines.append(f"| {title} | " + " | ".join(str(len(getattr(s, attr))) for s in shapes) + " |")
    lines.append("")
    for s in shapes:
        lines.append(f'Layers contract of {s.label}: "{s.contract}"')
    for s in shapes:
        for title, attr in MEASURES:
            found = getattr(s, attr)
            lines += ["", f"## {s.label}: {title} ({len(found)})", ""]
            lines += [f"- {item}" for item in found] or ["none"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree", nargs="?", default="tunectl", help="folder to measure (default: tunectl)")
    parser.add_argument("--ref", help="also measure this commit, and print the two side by side")
    parser.add_argument("--check", action="store_true", help="exit 1 if this checkout's tree breaks a limit")
    args = parser.parse_args(argv)
    repo = Path(__file__).resolve().parents[2]
    try:
        tree = _tree_in(repo, args.tree)
        shapes = [measure_ref(repo, args.ref, tree)] if args.ref else []
        shapes.append(measure(repo, tree, label=working_label(repo)))
    except (ShapeError, SyntaxError, UnicodeDecodeError) as exc:
        print(f"code_shape: {exc}", file=sys.stderr)
        return 2
    print(report(shapes))
    return 1 if args.check and shapes[-1].over_limits() else 0


def _tree_in(repo: Path, tree: str) -> str:
    """``tree`` as a path relative to the repository root (where ``--ref`` finds it too)."""
    path = Path(tree).resolve()
    if not path.is_relative_to(repo):
        raise ShapeError(f"{tree} is not inside {repo}")
    return path.relative_to(repo).as_posix()


if __name__ == "__main__":
    sys.exit(main())
