"""The public API: everything documented, and the type stubs in step with the module."""

import ast
import inspect
import pathlib

import syncmem
import syncmem._native as native

STUBS = pathlib.Path(syncmem.__file__).with_name("_native.pyi")


def public_members(cls):
    return [n for n in vars(cls) if not n.startswith("_") or n in ("__dlpack__", "__array__")]


def test_everything_public_has_a_docstring():
    assert syncmem.__doc__ and native.__doc__
    for name in syncmem.__all__:
        obj = getattr(syncmem, name)
        assert inspect.getdoc(obj), name
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            for member in public_members(obj):
                assert inspect.getdoc(getattr(obj, member)), f"{name}.{member}"


def test_stubs_cover_the_native_module():
    tree = ast.parse(STUBS.read_text())
    stubbed = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            stubbed[node.name] = {
                n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            }
        elif isinstance(node, ast.FunctionDef):
            stubbed[node.name] = set()
    exported = {n for n in dir(native) if not n.startswith("_")}
    assert exported == set(stubbed), exported ^ set(stubbed)
    for name, members in stubbed.items():
        obj = getattr(native, name)
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            assert set(public_members(obj)) <= members, (name, set(public_members(obj)) - members)
    # Exception classes: the stub names the same bases, in the same order.
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and issubclass(getattr(native, node.name), BaseException):
            obj = getattr(native, node.name)
            bases = [b.__name__ for b in obj.__bases__]
            assert [ast.unparse(b) for b in node.bases] == bases, node.name
    assert pathlib.Path(syncmem.__file__).with_name("py.typed").exists()
