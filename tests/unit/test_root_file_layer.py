"""Every file the package writes, makes, renames or removes goes through the root-file layer (system/root_files on
system/safe_fs: no link followed on the way, atomic writes, one trust rule per kind of file). Like
test_dependency_table, an AST walk over plugins/module_utils/numa/: a raw os.open for writing or creating,
os.rename/os.replace, os.mkdir/os.makedirs, os.symlink/os.link, os.unlink/os.remove/os.rmdir, a shutil call that
writes, or the builtin open() in a writing mode, anywhere outside the layer, fails with its file:line."""

import ast
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(REPO, "plugins", "module_utils", "numa")

# The layer itself: the only modules that make these calls.
LAYER = frozenset(("system/safe_fs.py", "system/root_files.py"))
# (module, call) made raw outside the layer, each for a reason written beside it.
ALLOWED = frozenset()  # type: frozenset  # none today
# os functions that change what a path names.
PATH_CHANGES = frozenset(("rename", "renames", "replace", "mkdir", "makedirs", "symlink", "link", "unlink", "remove",
                          "rmdir", "removedirs", "truncate", "mkfifo", "mknod"))
SHUTIL_WRITES = frozenset(("copy", "copy2", "copyfile", "copytree", "copyfileobj", "move", "rmtree"))
WRITE_FLAGS = frozenset(("O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC", "O_TMPFILE"))
WRITE_MODES = frozenset("wax+")
FIX = "use the root-file layer (system/root_files, on system/safe_fs), or allow it in ALLOWED with the reason"


def modules():
    """(relative path, parsed tree) of every module of the package."""
    found = []
    for directory, _, names in os.walk(PACKAGE):
        for name in sorted(names):
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                with open(path) as handle:
                    found.append((os.path.relpath(path, PACKAGE), ast.parse(handle.read(), path)))
    return found


def constants(trees):
    """{name: [value expressions]} of every module-level assignment in the package, so that a flags constant
    (``_TASKS_FLAGS``, ``safe_fs.CREATE_FLAGS``) is judged by what it holds."""
    table = {}
    for _path, tree in trees:
        for node in tree.body:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        table.setdefault(target.id, []).append(node.value)
    return table


def names_in(expression, table, seen=None):
    """Every name and attribute an expression reaches, module-level constants expanded."""
    seen = set() if seen is None else seen
    found = set()
    for node in ast.walk(expression):
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        if name is None or name in seen:
            continue
        seen.add(name)
        found.add(name)
        for value in table.get(name, ()):
            found |= names_in(value, table, seen)
    return found


def argument(call, position, keyword):
    if len(call.args) > position:
        return call.args[position]
    return next((item.value for item in call.keywords if item.arg == keyword), None)


def raw_call(call, table):
    """The name of a raw write ``call`` makes ("os.open", "open", "os.unlink", ...), or None."""
    func = call.func
    if isinstance(func, ast.Name) and func.id == "open":
        mode = argument(call, 1, "mode")
        if mode is None:
            return None
        # A mode that is not a literal cannot be shown to read only.
        if not (isinstance(mode, ast.Constant) and isinstance(mode.value, str)) or WRITE_MODES & set(mode.value):
            return "open"
        return None
    if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)):
        return None
    owner, name = func.value.id, func.attr
    if owner == "os" and name == "open":
        flags = argument(call, 1, "flags")
        return "os.open" if flags is not None and WRITE_FLAGS & names_in(flags, table) else None
    if (owner == "os" and name in PATH_CHANGES) or (owner == "shutil" and name in SHUTIL_WRITES):
        return "%s.%s" % (owner, name)
    return None


def violations(trees):
    """(module, line, call) of every raw write outside the layer."""
    table = constants(trees)
    found = []
    for path, tree in trees:
        if path in LAYER:
            continue
        for node in ast.walk(tree):
            call = raw_call(node, table) if isinstance(node, ast.Call) else None
            if call:
                found.append((path, node.lineno, call))
    return found


def test_every_write_outside_the_layer_is_an_allowed_one():
    unexplained = ["plugins/module_utils/numa/%s:%d: raw %s( outside the root-file layer: %s" % (path, line, call, FIX)
                   for path, line, call in violations(modules()) if (path, call) not in ALLOWED]
    assert not unexplained, "\n".join(unexplained)


def test_every_allowed_entry_is_still_needed():
    made = set((path, call) for path, _line, call in violations(modules()))
    assert not ALLOWED - made, "no longer made, remove from ALLOWED: %s" % sorted(ALLOWED - made)


@pytest.mark.parametrize("source,call", [
    ("os.open(name, os.O_WRONLY | os.O_TRUNC)", "os.open"),
    ("os.open(name, flags=_FLAGS, dir_fd=fd)", "os.open"),
    ("os.replace(a, b)", "os.replace"),
    ("os.rename(a, b)", "os.rename"),
    ("os.makedirs(path)", "os.makedirs"),
    ("os.symlink(a, b)", "os.symlink"),
    ("os.remove(path)", "os.remove"),
    ("open(path, 'a')", "open"),
    ("open(path, mode='r+')", "open"),
    ("open(path, mode)", "open"),
    ("shutil.move(a, b)", "shutil.move"),
])
def test_a_raw_write_is_found(source, call):
    trees = [("act/new.py", ast.parse("_FLAGS = os.O_CREAT | os.O_EXCL\n" + source))]
    assert violations(trees) == [("act/new.py", 2, call)]


@pytest.mark.parametrize("source", [
    "os.open(name, os.O_RDONLY | os.O_NOFOLLOW)", "os.open(name, READ)", "open(path)", "open(path, 'rb')",
    "open(path, encoding='utf-8')", "text.replace('a', 'b')",
])
def test_a_read_is_not_a_write(source):
    trees = [("act/new.py", ast.parse("READ = os.O_RDONLY\n" + source))]
    assert violations(trees) == []
