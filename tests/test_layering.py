"""No module of Folio's packages takes part in an import cycle.

Every import counts: module level, inside functions and under ``TYPE_CHECKING``. A
package's ``__init__`` importing its own submodules is fine; it only becomes a cycle
when one of those submodules imports the package back (``from kernels import X`` inside
``kernels.reference.backend`` while ``kernels`` imports ``kernels.reference.backend``).

The layering contracts (who may import whom) live in pyproject.toml under
``[tool.importlinter]`` and run with ``make lint``.
"""

from __future__ import annotations

import grimp
import pytest

PACKAGES = ("engine", "kernels", "desktop_app")


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    # cache_dir=None: nothing written into the working tree.
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def strongly_connected_components(graph: grimp.ImportGraph) -> list[list[str]]:
    """The import graph's strongly connected components of more than one module
    (Tarjan's algorithm, iterative), each sorted, the list sorted."""
    index: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = lowlink[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = lowlink[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                    break
                if child in on_stack:
                    lowlink[node] = min(lowlink[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    lowlink[parent] = min(lowlink[parent], lowlink[node])
                if lowlink[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
    return sorted(components)


def shortest_cycle(graph: grimp.ImportGraph, component: list[str]) -> list[str]:
    """A shortest cycle through the component's first module, staying in the component:
    [a, b, ..., a]."""
    start, members = component[0], set(component)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        next_frontier = []
        for node in frontier:
            for child in sorted(graph.find_modules_directly_imported_by(node)):
                if child not in members:
                    continue
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if child not in previous:
                    previous[child] = node
                    next_frontier.append(child)
        frontier = next_frontier
    raise AssertionError(f"no cycle in component {component}")  # pragma: no cover


def import_lines(graph: grimp.ImportGraph, importer: str, imported: str) -> str:
    lines = sorted({d["line_number"] for d in graph.get_import_details(
        importer=importer, imported=imported)})
    return f"{importer} line {', '.join(map(str, lines))}" if lines else importer


def describe_component(graph: grimp.ImportGraph, component: list[str]) -> str:
    """One shortest cycle, `a -> b (a line 12) -> a (b line 3)`, and for a bigger knot
    every import between its modules (each one a candidate to cut)."""
    cycle = shortest_cycle(graph, component)
    text = "- " + " -> ".join(
        [cycle[0]]
        + [f"{b} ({import_lines(graph, a, b)})" for a, b in zip(cycle, cycle[1:], strict=False)]
    )
    if len(component) > 2:
        members = set(component)
        text += f"\n  all {len(component)} modules in this knot, and their imports of each other:"
        for importer in component:
            for imported in sorted(graph.find_modules_directly_imported_by(importer) & members):
                where = import_lines(graph, importer, imported)
                text += f"\n    {importer} -> {imported} ({where})"
    return text


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycles(graph: grimp.ImportGraph, package: str) -> None:
    cycles = [
        component
        for component in strongly_connected_components(graph)
        if any(m == package or m.startswith(package + ".") for m in component)
    ]
    message = "\n".join(describe_component(graph, component) for component in cycles)
    assert not cycles, f"import cycles involving {package}:\n{message}"


def test_cycle_finder_sees_a_two_way_import() -> None:
    """The finder itself: a package whose submodule imports it back is a cycle, a
    package importing its submodules is not."""
    graph = grimp.ImportGraph()
    for module in ("pkg", "pkg.a", "pkg.b", "pkg.c", "other"):
        graph.add_module(module)
    graph.add_import(importer="pkg", imported="pkg.a")
    graph.add_import(importer="pkg.a", imported="pkg.b")
    graph.add_import(importer="pkg.c", imported="other")
    assert strongly_connected_components(graph) == []
    graph.add_import(importer="pkg.b", imported="pkg", line_number=7, line_contents="import pkg")
    assert strongly_connected_components(graph) == [["pkg", "pkg.a", "pkg.b"]]
    assert shortest_cycle(graph, ["pkg", "pkg.a", "pkg.b"]) == ["pkg", "pkg.a", "pkg.b", "pkg"]
    assert describe_component(graph, ["pkg", "pkg.a", "pkg.b"]).startswith(
        "- pkg -> pkg.a (pkg) -> pkg.b (pkg.a) -> pkg (pkg.b line 7)\n"
        "  all 3 modules in this knot"
    )
