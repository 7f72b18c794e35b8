#!/usr/bin/env python3
"""Checks the shape of src/: import circles between files, long functions,
and stringly-typed errors. Run by tests/architecture.rs in CI.

  scripts/arch_check.py [--report]     exit 1 when a rule is broken
  scripts/arch_check.py --self-test    checks that rules 1 and 4 catch what
                                       they should, on small made-up trees

Rules (issue 16):
  1. No import circles between files. An import is a `use crate::...`,
     `use super::...`, `use self::...` or `use child::...` (a module the
     file declares) path, or an inline `crate::a::b`, `super::a::b` or
     `child::a` path, naming an item of another file; `mod.rs` re-exports
     count like any other import.
     One pattern is allowed, and counted on its own line so it can only
     shrink (tests/architecture.rs has its ceiling): a circle that needs
     an import from a module file *down* into a module it declares (its
     child, or below). Every directory here is a parent `mod.rs` that
     declares the shared items of its children (an error type, a helper,
     the command-line or router types) and is also their facade: it
     re-exports them, dispatches commands or routes to them, wires them
     up. Its children use those shared items (`super::ApiError`), so each
     such directory is one strongly connected set of files. The downward
     edge is what `mod child;` already is: a parent always depends on the
     children it declares. What is refused is a circle that still closes
     without such an edge: files importing each other sideways (siblings,
     cousins) or upwards. Splitting each parent into "shared items" and
     "facade" files would remove the pattern, at the price of a file per
     directory whose only reason is this count; the allowed count says
     how many directories still have it (ALLOWED_CIRCLES_WHY).
  2. No function longer than MAX_FN_LINES lines outside tests.
  3. No `Result<_, String>` and no `#[error("{0}")] X(String)` outside the
     HTTP edge (EDGE_FILES).
  4. Layers (LAYERS): each listed directory imports only from the places
     its entry allows, plus PURE_HELPERS, which must themselves import no
     other file of the crate. api/wire (the JSON) links nothing of the
     server side; api/client links only wire; cli links only the client
     and wire, except the seams (SEAMS): the one that starts the daemon,
     and `ramd bench`'s, which runs the benchmark engine (bench/). bench
     links the report types (wire), the histogram, the NBD codec and
     client handshake, the backend trait, nothing of the daemon. api/wire
     names no external crate but serde (WIRE_CRATES).

--report prints the counts and every finding even when the rules hold.
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SRC = os.path.join(ROOT, "src")
MAX_FN_LINES = 120
# Where strings are the interface: the HTTP error mapping and the CLI's
# top-level message printing.
EDGE_FILES = {"src/api/server/error.rs", "src/main.rs"}
# Pure helpers any layer may use: formatting and parsing of sizes, the
# default socket paths. They import no other file of the crate (checked).
PURE_HELPERS = {"src/size.rs", "src/paths.rs"}
# Rule 4: a file under the key may import files under these prefixes (its
# own directory included) and PURE_HELPERS, nothing else of the crate.
# Why: the client and the command line are a thin layer over the JSON, so a
# change inside the daemon cannot break them except through the API, and
# wire types cannot silently change shape because an internal type did.
LAYERS = {
    "src/api/wire/": ("src/api/wire/",),
    "src/api/client/": ("src/api/client/", "src/api/wire/"),
    "src/cli/": ("src/cli/", "src/api/client/", "src/api/wire/"),
    # The benchmark runs in the command's process and measures the daemon
    # from outside, as any NBD client does: its report is the API's
    # BenchReport (wire), it records into metrics' histogram, speaks NBD
    # with nbd::proto after the cache's NBD client's handshake (not a
    # third client) and calls that client as a Backend. Nothing of the
    # daemon (control, api::server, the stores) links into it.
    "src/bench/": (
        "src/bench/",
        "src/api/wire/",
        "src/metrics/histogram.rs",
        "src/nbd/proto.rs",
        "src/cache/backing/nbd_client/",
        "src/block/backend.rs",
    ),
}
# Single files allowed more than their layer, and why.
SEAMS = {
    # `ramd daemon` runs the server in this process; the daemon's own rules
    # for names and sizes are checked before any request (exit 2), and
    # `ramd install-units` reads the config's [[dir]]s with its parser.
    "src/cli/daemon.rs": ("src/control/",),
    # `ramd bench` generates the load in this process (a client of the
    # daemon's NBD socket like fio, of its API like every command): the
    # one command-line file that runs the engine.
    "src/cli/bench.rs": ("src/bench/",),
}
# Rule 1's exception, in one line for the report (see the docstring).
ALLOWED_CIRCLES_WHY = (
    "a parent mod.rs declares what its children share and is also their facade "
    "(re-exports, dispatch, routes): circles that need its downward imports are allowed"
)
# The external crates api/wire may name: serde types only.
WIRE_CRATES = {"std", "core", "alloc", "serde", "serde_json", "crate", "super", "self"}


def rel(path):
    return os.path.relpath(path, ROOT)


def rust_files():
    for d, _, files in os.walk(SRC):
        for f in sorted(files):
            if f.endswith(".rs"):
                yield os.path.join(d, f)


def module_of(path):
    """src/a/b.rs -> ['a', 'b']; src/a/mod.rs -> ['a']; src/lib.rs -> []."""
    parts = os.path.relpath(path, SRC)[:-3].split(os.sep)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return parts


def strip_tests_and_comments(text, keep_strings=False):
    """The text without `#[cfg(test)] mod ... { }` blocks, comments and
    (unless `keep_strings`) the contents of string literals, so braces in
    them do not count."""
    out = []
    i, n = 0, len(text)
    while i < n:
        if text.startswith("#[cfg(test)]", i):
            j = text.find("\n", i)
            rest = text[j + 1 :].lstrip()
            if re.match(r"(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{", rest):
                start = text.index("{", j)
                end = match_brace(text, start)
                # Keep the line count.
                out.append("\n" * text.count("\n", i, end + 1))
                i = end + 1
                continue
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i)
            out.append("\n" * text.count("\n", i, j))
            i = j + 2
            continue
        if c == '"' or text.startswith('r"', i) or text.startswith("r#", i):
            j = skip_string(text, i)
            out.append(text[i:j] if keep_strings else '""' + "\n" * text.count("\n", i, j))
            i = j
            continue
        if c == "'" and re.match(r"'(\\.|[^\\'])'", text[i : i + 4]):
            j = text.index("'", i + 2 if text[i + 1] != "\\" else i + 3) + 1
            out.append("' '")
            i = j
            continue
        out.append(c)
        i += 1
    return "".join(out)


def skip_string(text, i):
    if text[i] == "r":
        m = re.match(r'r(#*)"', text[i:])
        hashes = m.group(1)
        end = text.index('"' + hashes, i + len(m.group(0)))
        return end + 1 + len(hashes)
    j = i + 1
    while text[j] != '"':
        j += 2 if text[j] == "\\" else 1
    return j + 1


def match_brace(text, start):
    depth = 0
    for k in range(start, len(text)):
        if text[k] == "{":
            depth += 1
        elif text[k] == "}":
            depth -= 1
            if depth == 0:
                return k
    return len(text) - 1


def resolve(modules, base, path):
    """The file a path `a::b::c` (relative to module `base`) names: the
    longest prefix that is a module."""
    parts = list(base) + path
    for k in range(len(parts), 0, -1):
        f = modules.get(tuple(parts[:k]))
        if f:
            return f
    return None


USE_RE = re.compile(r"\buse\s+([^;]+);", re.S)
INLINE_RE = re.compile(r"\b(crate|super)((?:::\w+)+)")
# A path that may start with a child module's name (`drives::create(..)`);
# not the tail of a longer path (`crate::a::b` is INLINE_RE's).
CHILD_RE = re.compile(r"(?<!::)\b(\w+)((?:::\w+)+)")


def expand_use(tree):
    """`a::{b, c::{d}}` -> ['a::b', 'a::c::d']."""
    tree = re.sub(r"\s+", "", tree)
    m = re.match(r"^(.*?)::\{(.*)\}$", tree)
    if not m:
        return [tree]
    prefix, inner = m.groups()
    items, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    if cur:
        items.append(cur)
    return [p for it in items if it for p in expand_use(prefix + "::" + it)]


def imports(path, text, modules):
    me = module_of(path)
    # `super` of module a::b is a, whether it lives in a/b.rs or a/b/mod.rs.
    parent = me[:-1]
    targets = set()

    def add(p):
        parts = p.split("::")
        if parts[0] == "crate":
            base, rest = [], parts[1:]
        elif parts[0] == "super":
            base, rest = list(parent), parts[1:]
            while rest and rest[0] == "super":
                base, rest = base[:-1], rest[1:]
        elif parts[0] == "self":
            base, rest = list(me), parts[1:]
        elif tuple(me + [parts[0]]) in modules:
            # `use child::X`: relative to this module (2018 paths).
            base, rest = list(me), parts
        else:
            return
        rest = [r for r in rest if r not in ("*", "self")]
        f = resolve(modules, base, rest)
        if f and f != path:
            targets.add(f)

    for m in USE_RE.finditer(text):
        for p in expand_use(m.group(1)):
            add(re.sub(r"as\w+$", "", p) if "::" in p else p)
    for m in INLINE_RE.finditer(text):
        add(m.group(1) + m.group(2))
    for m in CHILD_RE.finditer(text):
        if tuple(me + [m.group(1)]) in modules:
            add(m.group(1) + m.group(2))
    return targets


def circles(graph):
    """Strongly connected components of more than one file (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def is_below(f, g):
    """File g's module is declared by file f's module (a child or below)."""
    me, them = module_of(f), module_of(g)
    return len(me) < len(them) and them[: len(me)] == me


def split_circles(graph):
    """Rule 1: (circles, allowed). `circles` are those that still close
    without the downward imports of a parent into the modules it declares;
    `allowed` are the others (parent/child circles, the allowed pattern)."""
    upward_and_sideways = {f: {g for g in gs if not is_below(f, g)} for f, gs in graph.items()}
    real = circles(upward_and_sideways)
    in_real = {f for c in real for f in c}
    allowed = [c for c in circles(graph) if not in_real.intersection(c)]
    return real, allowed


FN_RE = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?(?:extern\s+\"C\"\s+)?fn\s+(\w+)", re.M)


def long_functions(path, text):
    found = []
    for m in FN_RE.finditer(text):
        brace = text.find("{", m.end())
        semi = text.find(";", m.end())
        if brace < 0 or (0 <= semi < brace):
            continue  # a declaration without a body
        end = match_brace(text, brace)
        lines = text.count("\n", m.start(), end) + 1
        if lines > MAX_FN_LINES:
            line = text.count("\n", 0, m.start()) + 1
            found.append((rel(path), line, m.group(1), lines))
    return found


STRING_RESULT_RE = re.compile(r"Result<[^;{]*?,\s*String\s*>")
STRING_VARIANT_RE = re.compile(r'#\[error\("\{0\}"\)\]\s*\w+\(String\)')


def string_errors(path, text):
    if rel(path) in EDGE_FILES:
        return []
    out = []
    for rx, what in ((STRING_RESULT_RE, "Result<_, String>"), (STRING_VARIANT_RE, '#[error("{0}")] X(String)')):
        for m in rx.finditer(text):
            out.append((rel(path), text.count("\n", 0, m.start()) + 1, what))
    return out


EXTERNAL_USE_RE = re.compile(r"\buse\s+:*(\w+)")


def layer_breaks(graph, texts):
    """Imports that leave a file's layer (rule 4)."""
    out = []
    for f in sorted(graph):
        r = rel(f)
        if r in PURE_HELPERS:
            out += [(r, rel(g), "a pure helper imports another file") for g in sorted(graph[f])]
            continue
        layer = next((k for k in LAYERS if r.startswith(k)), None)
        if layer is None:
            continue
        allowed = LAYERS[layer] + SEAMS.get(r, ())
        for g in sorted(graph[f]):
            rg = rel(g)
            if rg not in PURE_HELPERS and not rg.startswith(allowed):
                out.append((r, rg, f"{layer} may import only {', '.join(allowed)} and {', '.join(sorted(PURE_HELPERS))}"))
        if layer == "src/api/wire/":
            for m in EXTERNAL_USE_RE.finditer(texts[f]):
                if m.group(1) not in WIRE_CRATES:
                    out.append((r, m.group(1), "api/wire uses serde only"))
    return out


def graph_of_tree():
    """(import graph, stripped texts) of the tree under SRC."""
    files = list(rust_files())
    modules = {tuple(module_of(f)): f for f in files}
    texts = {f: strip_tests_and_comments(open(f).read()) for f in files}
    return {f: imports(f, texts[f], modules) for f in files}, texts


def layer_findings():
    """Rule 4's findings on the tree under SRC."""
    return layer_breaks(*graph_of_tree())


def circle_findings():
    """Rule 1's findings on the tree under SRC: (circles, allowed), each a
    sorted list of sorted lists of paths relative to ROOT."""
    real, allowed = split_circles(graph_of_tree()[0])
    return tuple(sorted(sorted(rel(f) for f in c) for c in cs) for cs in (real, allowed))


# (file, text) of a made-up tree, and the breaks rule 4 must find in it.
SELF_TEST_TREE = {
    "src/lib.rs": "pub mod api; pub mod bench; pub mod cli; pub mod control; pub mod size;",
    "src/size.rs": "use crate::control::Daemon;",
    "src/control/mod.rs": "pub struct Daemon;",
    "src/api/mod.rs": "pub mod client; pub mod server; pub mod wire;",
    "src/api/wire/mod.rs": "use serde::Serialize;\nuse axum::Json;\nuse crate::control::Daemon;\nuse crate::size::parse;",
    "src/api/server/mod.rs": "use crate::control::Daemon;\nuse crate::api::wire::X;",
    "src/api/client/mod.rs": "use crate::api::wire::X;\nuse crate::api::server::ROUTES;",
    "src/cli/mod.rs": "use crate::api::client::Client;\nuse super::control::Daemon;\nfn f() { crate::api::server::serve(); }",
    "src/cli/daemon.rs": "use crate::control::Daemon;",
    "src/cli/bench.rs": "use crate::bench::run;",
    "src/cli/drives.rs": "use crate::bench::run;",
    "src/bench/mod.rs": "use crate::api::wire::X;\nuse crate::control::Daemon;",
}
SELF_TEST_EXPECTED = {
    ("src/size.rs", "src/control/mod.rs"),
    ("src/api/wire/mod.rs", "axum"),
    ("src/api/wire/mod.rs", "src/control/mod.rs"),
    ("src/api/client/mod.rs", "src/api/server/mod.rs"),
    ("src/cli/mod.rs", "src/control/mod.rs"),
    ("src/cli/mod.rs", "src/api/server/mod.rs"),
    ("src/cli/drives.rs", "src/bench/mod.rs"),
    ("src/bench/mod.rs", "src/control/mod.rs"),
}


# A made-up tree for rule 1: `a` is the allowed pattern (its mod.rs
# dispatches to children named in a `use child::X` and an inline
# `child::f()`, the children use its shared item); `b` a real circle
# between siblings; `c` and `e` a real one that goes up (c/x.rs uses its
# parent's item) and sideways (c/mod.rs -> e.rs -> c/x.rs); `d` a child
# that imports its parent, with nothing coming back (no circle).
SELF_TEST_CIRCLES_TREE = {
    "src/lib.rs": "pub mod a; pub mod b; pub mod c; pub mod d; pub mod e;",
    "src/a/mod.rs": "mod run; mod show;\nuse run::go;\npub struct Shared;\nfn f() { show::print(); }",
    "src/a/run.rs": "use super::Shared;\npub fn go() {}",
    "src/a/show.rs": "pub fn print(s: crate::a::Shared) {}",
    "src/b/mod.rs": "mod one; mod two;",
    "src/b/one.rs": "use super::two::Two;\npub struct One;",
    "src/b/two.rs": "use super::one::One;\npub struct Two;",
    "src/c/mod.rs": "pub mod x;\npub struct C(crate::e::E);",
    "src/c/x.rs": "use super::C;\npub struct X;",
    "src/e.rs": "pub struct E(crate::c::x::X);",
    "src/d/mod.rs": "mod leaf;\npub struct D;",
    "src/d/leaf.rs": "use super::D;",
}
SELF_TEST_CIRCLES_EXPECTED = (
    [["src/b/one.rs", "src/b/two.rs"], ["src/c/mod.rs", "src/c/x.rs", "src/e.rs"]],
    [["src/a/mod.rs", "src/a/run.rs", "src/a/show.rs"]],
)


def on_made_up_tree(tree, check):
    """`check()` run with ROOT and SRC pointing at `tree` written out."""
    import tempfile

    global ROOT, SRC
    saved = ROOT, SRC
    with tempfile.TemporaryDirectory() as root:
        for path, text in tree.items():
            os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
            with open(os.path.join(root, path), "w") as f:
                f.write(text + "\n")
        ROOT, SRC = root, os.path.join(root, "src")
        try:
            return check()
        finally:
            ROOT, SRC = saved


def self_test():
    """Rule 4 on SELF_TEST_TREE finds exactly SELF_TEST_EXPECTED, rule 1
    on SELF_TEST_CIRCLES_TREE exactly SELF_TEST_CIRCLES_EXPECTED."""
    failed = 0
    found = on_made_up_tree(SELF_TEST_TREE, lambda: {(f, t) for f, t, _ in layer_findings()})
    if found != SELF_TEST_EXPECTED:
        print("self-test failed: rule 4 found", sorted(found), "expected", sorted(SELF_TEST_EXPECTED))
        failed = 1
    else:
        print(f"self-test: rule 4 finds the {len(found)} breaks of the made-up tree")
    got = on_made_up_tree(SELF_TEST_CIRCLES_TREE, circle_findings)
    if got != SELF_TEST_CIRCLES_EXPECTED:
        print("self-test failed: rule 1 found (circles, allowed)", got, "expected", SELF_TEST_CIRCLES_EXPECTED)
        failed = 1
    else:
        print(f"self-test: rule 1 finds the {len(got[0])} circles and the {len(got[1])} allowed one of the made-up tree")
    return failed


def main():
    if "--self-test" in sys.argv:
        return self_test()
    report = "--report" in sys.argv
    files = list(rust_files())
    modules = {tuple(module_of(f)): f for f in files}
    texts = {f: strip_tests_and_comments(open(f).read()) for f in files}
    graph = {f: imports(f, texts[f], modules) for f in files}
    loops, allowed = split_circles(graph)
    longs = [x for f in files for x in long_functions(f, texts[f])]
    raw = {f: strip_tests_and_comments(open(f).read(), keep_strings=True) for f in files}
    strings = [x for f in files for x in string_errors(f, raw[f])]
    breaks = layer_breaks(graph, texts)
    ok = not loops and not longs and not strings and not breaks
    print(f"import circles: {len(loops)}; parent/child circles (allowed): {len(allowed)}; "
          f"functions over {MAX_FN_LINES} lines: {len(longs)}; "
          f"stringly-typed errors outside the HTTP edge: {len(strings)}; layer breaks: {len(breaks)}")
    if report or not ok:
        for c in loops:
            print("circle:", " <-> ".join(rel(f) for f in c))
            for f in c:
                for g in sorted(graph[f] & set(c)):
                    print(f"    {rel(f)} -> {rel(g)}")
        if allowed:
            print(f"allowed ({ALLOWED_CIRCLES_WHY}):")
        for c in allowed:
            print("parent/child circle:", " <-> ".join(rel(f) for f in c))
        for f, line, name, n in sorted(longs, key=lambda x: -x[3]):
            print(f"long function: {f}:{line} {name} ({n} lines)")
        for f, line, what in strings:
            print(f"string error: {f}:{line} {what}")
        for f, target, why in breaks:
            print(f"layer break: {f} -> {target} ({why})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
