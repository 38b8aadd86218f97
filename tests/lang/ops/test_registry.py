"""The op registry: every primitive declares what the verifier needs, in its own class body."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import attrs
import pytest
from click.testing import CliRunner

import layoutc.lang.ops
from layoutc.cli.main import main
from layoutc.lang.ops import MODULES, PUBLIC, REGISTRY
from layoutc.lang.ops.base import Category, Facts, Op


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_registered_op_declares_its_facts(name):
    cls = REGISTRY[name]
    assert issubclass(cls, Op) and attrs.has(cls) and cls.name == name
    # declared on the class itself or on a shared base that is not an op of its own (the row ops'
    # _RowOp), never inherited by accident from another registered op
    owner = next(c for c in cls.__mro__ if "facts" in vars(c))
    assert owner is cls or owner not in REGISTRY.values(), (name, owner)
    assert owner is not Op and isinstance(cls.facts, Facts) and isinstance(cls.facts.category, Category)
    assert cls.summary and "\n" not in cls.summary
    # the eager function, declared (its name is reserved in converters: lang.ops.generated_names)
    assert callable(cls.eager) and cls.eager.__name__.isidentifier()
    assert "\n" not in cls.notes + cls.needs  # cells of the README's op table
    if cls.facts.gate_up or cls.facts.slice:
        assert cls.facts.on_axis, "a gate/up or slice op acts along one axis"
    if cls.facts.on_axis:
        assert attrs.fields_dict(cls)["dim"].default is not None, "an op along one axis names it (Op.axis)"


def _op_classes_in_the_source() -> dict[str, type]:
    # Found without the registry's own list: every .py file of the package's folder, every class it
    # defines that is an Op with a name of its own (abstract bases have none).
    folder = Path(layoutc.lang.ops.__file__).parent
    found: dict[str, type] = {}
    for path in sorted(p for p in folder.glob("*.py") if p.stem != "__init__"):
        module = importlib.import_module(f"layoutc.lang.ops.{path.stem}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and issubclass(cls, Op) and "name" in vars(cls):
                assert cls.name not in found, f"two ops named {cls.name!r}"
                found[cls.name] = cls
    return found


def test_the_registry_is_every_op_in_the_source_and_nothing_else():
    source = _op_classes_in_the_source()
    assert len(source) >= 15  # the walk found the ops (a broken walk must not pass as an empty match)
    assert dict(REGISTRY) == source
    names = [cls.name for module in MODULES for cls in module.OPS]
    assert len(names) == len(set(names)), "an op listed twice"


def test_layoutc_ops_lists_every_public_op_with_its_facts():
    out = CliRunner().invoke(main, ["ops"]).output
    for name, cls in PUBLIC.items():
        line = next((ln for ln in out.splitlines() if ln.strip().startswith(name + "(")), None)
        assert line is not None, name
        assert cls.facts.category.value in line, line


def _defaults_on_ops(source: str, in_ops: bool) -> list[str]:
    """Every ``getattr(<op>, "...", default)`` in ``source``, where <op> is an op (``s.op``, ``op``, or
    ``self`` in an op module): a default hides an undeclared fact (``getattr(s.op, "parts", 1)``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                and len(node.args) == 3:
            target = ast.unparse(node.args[0])
            if target == "op" or target.endswith(".op") or (in_ops and target == "self"):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_declared_facts_are_read_never_guessed_with_a_default():
    package, ops = Path(layoutc.__file__).parent, Path(layoutc.lang.ops.__file__).parent
    found = [f"{path.relative_to(package)}:{line}" for path in sorted(package.rglob("*.py"))
             for line in _defaults_on_ops(path.read_text(), path.parent == ops)]
    assert found == []
    # what the scan finds (the lines it found before the facts were read as declared)
    assert _defaults_on_ops('x = getattr(pads[0].op, "parts", 1) == 1', False)
    assert _defaults_on_ops('dim = getattr(self, "dim", None)', True)
    assert not _defaults_on_ops('v = getattr(s.op, field.name)', False)  # a declared field, read by name
    assert REGISTRY["swap_halves"](1).parts == 1 and REGISTRY["pad"](1, parts=2).parts == 2
