"""Facts read from Python source files without importing them: a module's file, a module-level constant, a
dataclass's fields (inherited ones included) with their annotations.

What for: a module that imports torch or TRL holds a constant or a dataclass a quick command needs (the config
check of ``rlt_mono.config_check``, ``compare`` in ``rlt_mono.stages.eval_compare``); reading its source with ``ast``
takes milliseconds, importing it seconds. A package is located with ``importlib.util.find_spec`` of its top-level name,
which does not run it; a class is followed through the ``from ... import`` statements of the modules that re-export
it (a lazy package's ``if TYPE_CHECKING:`` imports included), as TRL's and transformers' configs are.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path
from typing import Any


def module_file(module: str) -> Path | None:
    """The source file of ``module`` (``a.b.c``: ``<a's folder>/b/c/__init__.py`` or ``.../b/c.py``, the package first
    as Python's import finds it), located without importing it or its package; None when there is none."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None:
        return None
    if not spec.submodule_search_locations:  # a plain module
        return Path(spec.origin) if not rest and spec.origin else None
    base = Path(next(iter(spec.submodule_search_locations))).joinpath(*rest)
    for candidate in (base / "__init__.py", base.parent / f"{base.name}.py"):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _imported_from(node: ast.ImportFrom, module: str, path: Path) -> str:
    """The absolute module an ``from ... import`` in ``module`` (source ``path``) reads from."""
    if not node.level:
        return node.module or ""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    parts = package.split(".")
    anchor = parts[: len(parts) - node.level + 1]
    return ".".join(anchor + ([node.module] if node.module else []))


def _find_class(module: str, name: str, hops: int = 0) -> tuple[str, ast.ClassDef] | None:
    """Where class ``name`` as seen from ``module`` is defined: in the module, or behind its ``from x import``
    statements (a lazy package's ``if TYPE_CHECKING:`` imports included)."""
    path = module_file(module)
    if path is None or hops > 8:
        return None
    tree = _tree(path)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return module, node
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    found = _find_class(_imported_from(node, module, path), alias.name, hops + 1)
                    if found is not None:
                        return found
    return None


def _base_reference(base: ast.expr, module: str) -> tuple[str, str] | None:
    """(module, class name) of a base class written ``Name`` or ``package.Name`` (after ``import package``)."""
    if isinstance(base, ast.Name):
        return module, base.id
    if isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name):
        for node in ast.walk(_tree(module_file(module))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if (alias.asname or alias.name) == base.value.id:
                        return alias.name, base.attr
    return None


@functools.cache
def _class_fields(module: str, name: str) -> dict[str, ast.expr] | None:
    found = _find_class(module, name)
    if found is None:
        return None
    module, node = found
    fields: dict[str, ast.expr] = {}
    for base in reversed(node.bases):  # dataclasses collect fields over the MRO from its end
        reference = _base_reference(base, module)
        inherited = _class_fields(*reference) if reference is not None else None
        if inherited is None:
            return None
        fields.update(inherited)
    for statement in node.body:
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name) \
                and not any(word in ast.unparse(statement.annotation) for word in ("ClassVar", "KW_ONLY")):
            fields[statement.target.id] = statement.annotation
    return fields


def dataclass_fields(reference: str) -> dict[str, ast.expr] | None:
    """The fields of the dataclass ``"module:Class"`` and their annotations, read from the sources (None when they
    cannot be read)."""
    module, _, name = reference.partition(":")
    try:
        return _class_fields(module, name)
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None


def module_constant(module: str, name: str) -> Any:
    """The literal value of the module-level constant ``name`` of ``module`` (e.g. a tuple of choices), read from
    its source, so that a choice has one home even where its module is too heavy to import; None when the module
    has no such constant."""
    return tree_constant(_tree(module_file(module)), name)


def tree_constant(tree: ast.Module, name: str) -> Any:
    """The literal value of the module-level constant ``name`` assigned in the parsed module ``tree``; None when it
    assigns none."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    return None
