"""The layers of docs/architecture.md, enforced: each layer is a subpackage holding exactly the modules its
row names; every import of the package (function-level ones included) goes to a module of the same layer or a
lower one; no import cycle; nothing of Ansible or the collection's plugins (numa-pin runs on a bare python3)."""

import ast
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(REPO, "plugins", "module_utils", "numa")
ARCHITECTURE = os.path.join(REPO, "docs", "architecture.md")


def layer_table():
    """{"layer/module": (rank, layer)} from the rows: ``| 5. read | `kernel_files`, `topology` | ... |``.

    The top level's own files (``__init__``, ``__main__``) are the edge's too: row ``9. cli`` lists them
    with a leading slash."""
    with open(ARCHITECTURE) as handle:
        rows = re.findall(r"^\| (\d+)\. (\w+) \| ((?:`/?\w+`(?:, )?)+) \|", handle.read(), re.MULTILINE)
    table = {}
    for rank, layer, modules in rows:
        for module in re.findall(r"`(/?\w+)`", modules):
            key = module[1:] if module.startswith("/") else "%s/%s" % (layer, module)
            assert key not in table, "%s is in two layers" % key
            table[key] = (int(rank), layer)
    return table


def package_modules():
    """"layer/module" for every module of the package, "module" for the top level's own."""
    found = []
    for directory, _, names in os.walk(PACKAGE):
        relative = os.path.relpath(directory, PACKAGE)
        for name in names:
            if name.endswith(".py") and not (name == "__init__.py" and relative != "."):
                found.append(name[:-3] if relative == "." else "%s/%s" % (relative, name[:-3]))
    return sorted(found)


def imports_of(module):
    """(the package's modules ``module`` imports, every other name it imports), at any depth."""
    path = os.path.join(PACKAGE, module + ".py")
    with open(path) as handle:
        return imports_in(handle.read(), os.path.dirname(module))


def imports_in(source, layer):
    """Relative imports resolved to "layer/module" from a module of ``layer`` ("" for the top level)."""
    inside, outside = set(), set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level:
            inside.update(resolved(node, layer))
        elif isinstance(node, ast.ImportFrom):
            outside.add(node.module)
        elif isinstance(node, ast.Import):
            outside.update(alias.name for alias in node.names)
    return inside, outside


def resolved(node, layer):
    """The "layer/module" names one relative import reaches; an import above the package keeps its dots."""
    importer = [layer] if layer else []
    if node.level - 1 > len(importer):
        return {"." * node.level + (node.module or ", ".join(alias.name for alias in node.names))}
    target = importer[:len(importer) - (node.level - 1)] + (node.module.split(".") if node.module else [])
    if len(target) == 2:
        return {"/".join(target)}
    if len(target) == 1:  # a layer's subpackage: each name imported from it is one of its modules
        return {"%s/%s" % (target[0], alias.name) for alias in node.names}
    return {alias.name for alias in node.names}


def test_every_module_of_the_package_has_exactly_one_layer_and_lives_in_its_subpackage():
    assert sorted(layer_table()) == package_modules()


def upward_imports(table, graph):
    """Each import in ``graph`` ({module: modules it imports}) of a module of a later layer than the importer's."""
    return ["%s imports %s (%s)" % (module, imported, table[imported][1] if imported in table else "no layer")
            for module in sorted(graph) for imported in sorted(graph[module])
            if imported not in table or table[imported][0] > table[module][0]]


def test_every_import_goes_to_the_same_layer_or_below():
    assert upward_imports(layer_table(), {module: imports_of(module)[0] for module in package_modules()}) == []


def test_the_package_imports_no_ansible_no_plugin_and_nothing_above_itself():
    foreign = {}
    for module in package_modules():
        names = {name for name in imports_of(module)[1] if name.startswith(("ansible", "ansible_collections"))
                 or "plugins" in name}
        names |= {name for name in imports_of(module)[0] if name.startswith(".")}
        if names:
            foreign[module] = sorted(names)
    assert foreign == {}


def test_the_package_has_no_import_cycle():
    graph = {module: imports_of(module)[0] for module in package_modules()}
    done, path = set(), []

    def visit(module):
        if module in path:
            return path[path.index(module):] + [module]
        if module in done:
            return None
        path.append(module)
        for imported in sorted(graph.get(module, ())):
            cycle = visit(imported)
            if cycle:
                return cycle
        path.pop()
        done.add(module)
        return None

    cycles = [cycle for cycle in (visit(module) for module in sorted(graph)) if cycle]
    assert cycles == []


def test_the_checker_resolves_every_spelling_of_a_relative_import():
    source = ("import os\n\ndef later():\n    from ..read.topology import read\n    from ..system import kernel\n"
              "    from .request import OPTIONS\n    from . import judging\n    from ... import plugins\n")
    inside, outside = imports_in(source, "inputs")
    assert (inside, outside) == ({"read/topology", "system/kernel", "inputs/request", "inputs/judging", "...plugins"},
                                 {"os"})
    top_level = imports_in("from .cli.numa_pin import run\nfrom . import errors\n", "")
    assert top_level == ({"cli/numa_pin", "errors"}, set())


def test_the_checker_reports_an_upward_import():
    table = layer_table()
    # The planner reaching for the reader (a file) or the kernel (a syscall) is what the layers forbid.
    assert upward_imports(table, {"decide/placement": {"read/topology", "inputs/request"}}) == [
        "decide/placement imports read/topology (read)"]
    assert upward_imports(table, {"inputs/request": {"decide/placement"}}) == [
        "inputs/request imports decide/placement (decide)"]
    assert upward_imports(table, {"base/errors": {"base/nowhere"}}) == ["base/errors imports base/nowhere (no layer)"]
