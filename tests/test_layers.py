# The house's one-way imports (issue: host/ in layers): no import circle across tasks.py,
# host/ and firmware_py/ (module- and function-level imports alike), and no module of
# host/ or tasks.py reaching into another module's private names. A circle that comes
# back, or a private name used across modules, fails here with the modules named.
import ast
import os

from conftest import ROOT

# circles kept on purpose (none: the last, model <-> qmodel, ended when the slice's units
# and the Slicer moved to firmware_py/slicer.py)
KNOWN = set()


def _modules():
    mods = {"tasks": os.path.join(ROOT, "tasks.py")}
    for base in ("host", "firmware_py"):
        for dp, dn, fn in os.walk(os.path.join(ROOT, base)):
            dn[:] = [d for d in dn if d != "__pycache__"]
            for f in fn:
                if f.endswith(".py"):
                    p = os.path.join(dp, f)
                    name = os.path.relpath(p, ROOT)[:-3].replace(os.sep, ".")
                    mods[name[:-9] if name.endswith(".__init__") else name] = p
    return mods


def _imports(mods):
    # module -> {(imported module, names taken from it)}
    out = {}
    for m, p in mods.items():
        tree = ast.parse(open(p).read(), p)
        pkg = m if p.endswith("__init__.py") else m.rpartition(".")[0]
        got = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in mods:
                        got.add((a.name, None))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
                for a in node.names:
                    if base + "." + a.name in mods:
                        got.add((base + "." + a.name, None))
                    elif base in mods:
                        got.add((base, a.name))
        out[m] = {(t, n) for t, n in got if t != m}
    return out


def _circles(edges):
    # strongly connected components of more than one module (Tarjan, iterative)
    index, low, stack, on, comps, n = {}, {}, [], set(), [], [0]
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = n[0]
        n[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = n[0]
                    n[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.add(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    comps.append(frozenset(comp))
    return comps


def test_no_import_circles():
    mods = _modules()
    edges = {m: {t for t, _ in got} for m, got in _imports(mods).items()}
    found = set(_circles(edges))
    assert found == KNOWN, (sorted(sorted(c) for c in found - KNOWN), "gone (drop from KNOWN):", sorted(sorted(c) for c in KNOWN - found))
    # the finder finds one: a made-up circle is reported
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]


def test_no_private_names_across_host_modules():
    # host/ and tasks.py: no `from host.x import _name` and no `x._name` on a project module
    # (a module named with "_" inside its own package, e.g. host/bench/_flash.py, is that
    # package's helper and may be imported by its siblings)
    mods = _modules()
    bad = []
    for m, got in _imports(mods).items():
        if not (m == "tasks" or m.startswith("host")):
            continue
        for t, name in got:
            if name and name.startswith("_") and not name.startswith("__"):
                bad.append("%s imports %s from %s" % (m, name, t))
        tree = ast.parse(open(mods[m]).read())
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    if node.module + "." + a.name in mods:
                        aliases[a.asname or a.name] = node.module + "." + a.name
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in mods and a.asname:
                        aliases[a.asname] = a.name
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
                continue
            dotted, v = [], node.value  # x._y, or host.flash._y after `import host.flash`
            while isinstance(v, ast.Attribute):
                dotted.insert(0, v.attr)
                v = v.value
            if isinstance(v, ast.Name):
                name = ".".join([aliases.get(v.id, v.id)] + dotted)
                if name in mods and name != m:
                    bad.append("%s uses %s.%s" % (m, name, node.attr))
    assert not bad, bad
