"""The layers of docs/architecture.md, enforced: every import of the package (function-level ones included)
goes to a module of the same layer or a lower one, no import cycle, and nothing of Ansible or the collection's
plugins (numa-pin runs the package on a bare python3)."""

import ast
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(REPO, "plugins", "module_utils", "numa")
ARCHITECTURE = os.path.join(REPO, "docs", "architecture.md")


def layer_table():
    """{module: (rank, layer name)} from the table's rows: ``| 3. read | `kernel_files`, `topology` | ... |``."""
    with open(ARCHITECTURE) as handle:
        rows = re.findall(r"^\| (\d+)\. (\w+) \| ((?:`\w+`(?:, )?)+) \|", handle.read(), re.MULTILINE)
    table = {}
    for rank, name, modules in rows:
        for module in re.findall(r"`(\w+)`", modules):
            assert module not in table, "%s is in two layers" % module
            table[module] = (int(rank), name)
    return table


def package_modules():
    return sorted(name[:-3] for name in os.listdir(PACKAGE) if name.endswith(".py"))


def imports_of(module):
    """(the package's modules ``module`` imports, every other name it imports), at any depth."""
    with open(os.path.join(PACKAGE, module + ".py")) as handle:
        return imports_in(handle.read())


def imports_in(source):
    tree = ast.parse(source)
    inside, outside = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            inside.update([node.module.split(".")[0]] if node.module else [alias.name for alias in node.names])
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            outside.add(node.module)
        elif isinstance(node, ast.ImportFrom):
            outside.add("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            outside.update(alias.name for alias in node.names)
    return inside, outside


def test_every_module_of_the_package_has_exactly_one_layer():
    assert sorted(layer_table()) == package_modules()


def upward_imports(table, graph):
    """Each import in ``graph`` ({module: modules it imports}) of a module of a later layer than the importer's."""
    return ["%s (%s) imports %s (%s)" % (module, table[module][1], imported, table[imported][1])
            for module in sorted(graph) for imported in sorted(graph[module]) if table[imported][0] > table[module][0]]


def test_every_import_goes_to_the_same_layer_or_below():
    assert upward_imports(layer_table(), {module: imports_of(module)[0] for module in package_modules()}) == []


def test_the_package_imports_no_ansible_no_plugin_and_nothing_above_itself():
    foreign = {}
    for module in package_modules():
        names = {name for name in imports_of(module)[1]
                 if name.startswith((".", "ansible", "ansible_collections")) or "plugins" in name}
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
        for imported in sorted(graph[module]):
            cycle = visit(imported)
            if cycle:
                return cycle
        path.pop()
        done.add(module)
        return None

    cycles = [cycle for cycle in (visit(module) for module in sorted(graph)) if cycle]
    assert cycles == []


def test_the_checker_sees_function_level_imports_and_reports_an_upward_one():
    inside, outside = imports_in("import os\n\ndef later():\n    from .topology import read\n    from . import kernel\n")
    assert (inside, outside) == ({"topology", "kernel"}, {"os"})
    table = layer_table()
    # The planner reaching for the reader (a file) or the kernel (a syscall) is what the layers forbid.
    assert upward_imports(table, {"placement": {"topology", "request"}, "topology": set(), "request": set()}) == [
        "placement (decide) imports topology (read)"]
    assert upward_imports(table, {"request": {"placement"}, "placement": set()}) == [
        "request (request) imports placement (decide)"]
