"""docs/architecture.md stays true where a machine can tell, read from the source (nothing
is imported or run). The doc describes concepts, layers and rules, not one row per module,
so a refactor edits it only where a concept moves:

- every file or folder it names exists, and a dotted name it gives (`module.name`,
  `Class.name`, `env.name`) resolves; config keys (`trainer.x`, `policy.x`, `scale.x`) are
  fields of their config dataclasses;
- training/'s units (each folder, each top-level module) are the ones its layer table lists,
  their imports (those inside functions too) point down those layers, so there is no cycle,
  and each folder imports what its row in the folder table says;
- each folder of training/ opens with a one-line docstring, and the doc describes every
  folder (the concepts it holds, not each module: a refactor edits no row);
- the plain-function claims: losses.py imports torch alone, only speed/ calls
  torch.compile or captures a CUDA graph, and the loop names no algorithm.
"""
import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
TRAINING = ROOT / "training"
SOURCE = ("gpusim", "envs", "training", "cuda_kernels")
# where a dotted name starts: the installed package's name -> the source folder
PACKAGES = {"gpusim.training": "training", "gpusim.envs": "envs",
            "gpusim.cuda_kernels": "cuda_kernels", "gpusim": "gpusim", "training": "training",
            "envs": "envs"}
FILE_KINDS = (".py", ".cu", ".cuh", ".md")  # what a path in the doc names in the repository
GENERATED = {"gpusim_env_args.cuh"}  # written per argument layout by the CUDA C toolchain
CONFIG_SECTIONS = {"trainer": "training", "policy": "training", "scale": "gpusim/scale"}
INSTANCES = {"env": "Env"}  # `env.x`: an attribute of an Env
NOT_NAMES = {"cpu.max"}  # a dotted token that names no Python: cgroup v2's file


# ---- the doc ----------------------------------------------------------------------------
@functools.cache
def doc() -> str:
    return DOC.read_text()


def section(title: str) -> str:
    """The text under the heading `title` (its own level), up to the next heading of the same
    level or above."""
    lines = doc().splitlines()
    for i, line in enumerate(lines):
        match = re.match(r"(#+) (.*)$", line)
        if match and match.group(2) == title:
            level, out = len(match.group(1)), []
            for rest in lines[i + 1:]:
                heading = re.match(r"(#+) ", rest)
                if heading and len(heading.group(1)) <= level:
                    break
                out.append(rest)
            return "\n".join(out)
    raise AssertionError(f"docs/architecture.md has no heading {title!r}")


def rows(text: str) -> list:
    """The body rows of the Markdown tables in `text`, as lists of cells."""
    out = []
    for line in text.splitlines():
        if not line.startswith("|") or re.match(r"\|[-| ]+\|$", line):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])]
        out.append(cells)
    return [r for r in out if not all(c in ("module", "concept") for c in r)]


def table(text: str, header: tuple) -> list:
    """The body rows of the table in `text` whose header is `header`."""
    lines = text.splitlines()
    head = "| " + " | ".join(header) + " |"
    assert head in lines, f"no table headed {head}"
    body = []
    for line in lines[lines.index(head) + 2:]:
        if not line.startswith("|"):
            break
        body.append(line)
    return rows("\n".join(body))


def ticked(text: str) -> list:
    return re.findall(r"`([^`]+)`", text)


def headings_and_lines():
    """(the current heading, a line) for every line of the doc."""
    heading = ""
    for line in doc().splitlines():
        if line.startswith("#"):
            heading = line
        yield heading, line


# ---- the source -------------------------------------------------------------------------
@functools.cache
def source_files() -> tuple:
    return tuple(p for folder in SOURCE for p in sorted((ROOT / folder).rglob("*.py"))
                 if "__pycache__" not in p.parts)


@functools.cache
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def bound(node, imports: bool) -> set:
    """The names `node` defines: functions, classes, assignment targets (attributes too),
    `__all__`'s entries; with `imports`, the names its imports bind."""
    names = set()
    for n in ast.walk(node):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in n.targets if isinstance(n, ast.Assign) else [n.target]:
                for x in ast.walk(target):
                    if isinstance(x, ast.Name):
                        names.add(x.id)
                    elif isinstance(x, ast.Attribute):
                        names.add(x.attr)
            if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__"
                                                 for t in n.targets):
                names |= {e.value for e in ast.walk(n.value) if isinstance(e, ast.Constant)}
        elif imports and isinstance(n, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in n.names}
    return names


@functools.cache
def defined(path: Path, imports: bool = False) -> frozenset:
    names = bound(tree(path), imports)
    if path.name == "__init__.py":  # a package's modules and subpackages
        names |= {p.stem for p in path.parent.glob("*.py")}
        names |= {p.name for p in path.parent.iterdir() if (p / "__init__.py").is_file()}
    return frozenset(names)


@functools.cache
def classes() -> dict:
    """class name -> [(its bound names, its bases' names)] over the source."""
    out = {}
    for p in source_files():
        for n in ast.walk(tree(p)):
            if isinstance(n, ast.ClassDef):
                bases = [b.id if isinstance(b, ast.Name) else b.attr for b in n.bases
                         if isinstance(b, (ast.Name, ast.Attribute))]
                out.setdefault(n.name, []).append((bound(n, imports=False), bases))
    return out


def class_binds(cls: str, name: str, seen=()) -> bool:
    """Whether class `cls` (any class of that name) or one of its bases binds `name`."""
    for names, bases in classes().get(cls, []):
        if name in names or any(class_binds(b, name, seen + (cls,)) for b in bases
                                if b not in seen):
            return True
    return False


def modules_named(stem: str) -> list:
    """The source modules called `stem` (a file's stem or a package's folder name)."""
    return [p for p in source_files()
            if (p.parent.name if p.name == "__init__.py" else p.stem) == stem]


# ---- training's units and their imports -------------------------------------------------
def training_units() -> set:
    """Each folder (`speed/`) and top-level module (`loop.py`) of training/."""
    folders = {p.name + "/" for p in TRAINING.iterdir()
               if p.is_dir() and p.name != "__pycache__" and any(p.glob("*.py"))}
    return folders | {p.name for p in TRAINING.glob("*.py") if p.name != "__init__.py"}


def unit(parts: tuple) -> str:
    return parts[0] + "/" if (TRAINING / parts[0]).is_dir() else parts[0] + ".py"


def imported(path: Path) -> set:
    """The modules of training/ (as parts under it) that `path` imports, anywhere in it."""
    rel = path.relative_to(TRAINING).with_suffix("").parts
    package = rel[:-1]
    out = set()
    for node in ast.walk(tree(path)):
        if isinstance(node, ast.Import):
            out |= {tuple(a.name.split(".")[2:]) for a in node.names
                    if a.name.startswith("gpusim.training.")}
        elif isinstance(node, ast.ImportFrom):
            source = tuple((node.module or "").split(".")) if node.module else ()
            if node.level:
                if node.level - 1 > len(package):
                    continue  # above training/: tests/docs/test_layers.py's concern
                module = package[:len(package) - node.level + 1] + source
            elif source[:2] == ("gpusim", "training"):
                module = source[2:]
            else:
                continue
            if module:
                out.add(module)
            else:  # `from . import losses`, at training's top
                out |= {(a.name,) for a in node.names}
    return {m for m in out if m}


@functools.cache
def import_graph() -> dict:
    """unit -> the other units of training/ it imports."""
    graph = {u: set() for u in training_units()}
    for path in TRAINING.rglob("*.py"):
        if "__pycache__" in path.parts or path == TRAINING / "__init__.py":
            continue
        own = unit(path.relative_to(TRAINING).with_suffix("").parts)
        graph[own] |= {unit(m) for m in imported(path)} - {own}
    return graph


def layers() -> dict:
    """unit -> its layer number, from the doc's layer table."""
    out = {}
    for number, units, _ in table(section("Layers of `training/`"), ("layer", "units", "what")):
        for u in ticked(units):
            assert u not in out, f"{u} is in two layers of the table"
            out[u] = int(number)
    return out


def folder_rows() -> dict:
    """folder -> the units its row says the folder imports."""
    out = {}
    for folder, _, imports in table(section("Folders of `training/`"),
                                    ("folder", "holds", "imports of `training/`")):
        (name,) = ticked(folder)
        out[name] = set(ticked(imports)) if imports != "nothing" else set()
    return out


def test_the_layer_table_names_every_unit_of_training_once():
    assert set(layers()) == training_units()


def test_imports_point_down_the_layers():
    layer = layers()
    upward = [f"{a} (layer {layer[a]}) imports {b} (layer {layer[b]})"
              for a, targets in sorted(import_graph().items()) for b in sorted(targets)
              if layer[b] >= layer[a]]
    assert not upward, "; ".join(upward)


def test_training_has_no_import_cycle():
    graph = {u: set(t) for u, t in import_graph().items()}
    while graph:  # peel the units that import nothing left
        leaves = {u for u, targets in graph.items() if not targets & graph.keys()}
        assert leaves, f"an import cycle among {sorted(graph)}"
        graph = {u: t for u, t in graph.items() if u not in leaves}


def test_each_folder_imports_what_its_row_says():
    graph, described = import_graph(), folder_rows()
    folders = {u for u in training_units() if u.endswith("/")}
    assert set(described) == folders, "the folder table describes every folder, once"
    for folder, imports in described.items():
        assert graph[folder] == imports, f"{folder} imports {sorted(graph[folder])}"


def test_each_folder_opens_with_one_line():
    """Each folder's __init__.py is a one-line docstring, and nothing else except where the
    doc says so."""
    more = set(re.findall(r"nothing else\s+\(except\s+`(\w+/)`", section("Folders of `training/`")))
    assert more, "the doc says which folder's __init__ holds more than its docstring"
    for folder in (u for u in training_units() if u.endswith("/")):
        init = TRAINING / folder / "__init__.py"
        assert init.is_file(), f"{folder} has no __init__.py"
        docstring = ast.get_docstring(tree(init))
        assert docstring and "\n" not in docstring.strip(), f"{folder}: not a one-line docstring"
        if folder not in more:
            assert len(tree(init).body) == 1, f"{folder}__init__.py holds more than its line"


# ---- paths and names --------------------------------------------------------------------
def row_files(heading: str, cells: list) -> list:
    """The files a table row's first cell names (`a/b.py`, `c.py`: the second beside the
    first; in a section headed with a folder, relative to it)."""
    context = re.search(r"\(`([\w/]+/)`\)", heading)
    files, folder = [], None
    for name in ticked(cells[0]):
        for candidate in ([folder / name] if folder else []) + [ROOT / name] + (
                [ROOT / context.group(1) / name] if context else []):
            if candidate.exists():
                files.append(candidate)
                folder = candidate if candidate.is_dir() else candidate.parent
                break
    return files


def is_path(token: str) -> bool:
    """A file or folder of the repository (not a URL, a pattern, a placeholder, a file a run
    writes, or a file the toolchain generates)."""
    if not re.fullmatch(r"\w[\w./-]*", token) or re.search(r"[A-Z]{3,}_", token) \
            or token in GENERATED:
        return False
    return token.endswith("/") or token.endswith(FILE_KINDS)


def test_every_path_the_doc_names_exists():
    anywhere = {p.name for folder in (*SOURCE, "tests", "benchmarks", "docs")
                for p in (ROOT / folder).rglob("*")} | {p.name for p in ROOT.iterdir()}
    missing = []
    for heading, line in headings_and_lines():
        cells = rows(line)[0] if line.startswith("| `") else None
        files = row_files(heading, cells) if cells else []
        near = {f if f.is_dir() else f.parent for f in files}  # and the folders above it
        near |= {up for folder in near for up in folder.parents if ROOT in up.parents}
        for token in filter(is_path, ticked(line)):
            candidates = [ROOT / token, ROOT / "gpusim" / token, ROOT / "envs" / token]
            candidates += [folder / token for folder in near]
            if any(c.exists() for c in candidates):
                continue
            if "/" not in token.rstrip("/") and not near and token.rstrip("/") in anywhere:
                continue  # a bare name in prose: a file of that name exists
            missing.append(f"{heading}: {token}")
    assert not missing, missing


def resolve_dotted(token: str) -> bool | None:
    """Whether `a.b.c` names something that exists; None where it is no name of ours."""
    parts = token.split(".")
    head, name = parts[-2], parts[-1]
    if len(parts) == 2 and head in CONFIG_SECTIONS:  # a config key: a dataclass's field
        return any(name in bound(n, imports=False)
                   for p in (ROOT / CONFIG_SECTIONS[head]).rglob("*.py")
                   for n in ast.walk(tree(p))
                   if isinstance(n, ast.ClassDef) and n.name.endswith("Config"))
    if len(parts) == 2 and head in INSTANCES:
        return class_binds(INSTANCES[head], name)
    for prefix, folder in PACKAGES.items():  # a full module path
        if token == prefix:
            return True
        if token.startswith(prefix + "."):
            here, rest = ROOT / folder, token[len(prefix) + 1:].split(".")
            while rest and ((here / rest[0]).is_dir() or (here / f"{rest[0]}.py").is_file()):
                here = here / rest[0] if (here / rest[0]).is_dir() else here / f"{rest[0]}.py"
                rest = rest[1:]
            if not rest:
                return True
            module = here / "__init__.py" if here.is_dir() else here
            return module.is_file() and rest[0] in defined(module, imports=True)
    if modules_named(head):
        return any(name in defined(p, imports=True) for p in modules_named(head))
    if head in classes():
        return class_binds(head, name)
    return None


def test_dotted_names_resolve():
    """`module.name` (a module's stem or its full path), `Class.attribute`, `env.attribute`
    and config keys name what exists."""
    wrong = set()
    for token in re.findall(r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\([^`]*\))?`", doc()):
        if token.rsplit(".", 1)[1] in ("py", "md", "cu", "cuh", "json", "jsonl", "png",
                                       "yaml") or token in NOT_NAMES:
            continue
        if resolve_dotted(token) is False:
            wrong.add(token)
    assert not wrong, sorted(wrong)


# ---- plain functions --------------------------------------------------------------------
def attribute_chains(path: Path) -> set:
    """Every dotted name `path` uses (`torch.cuda.graph`)."""
    out = set()
    for node in ast.walk(tree(path)):
        if isinstance(node, ast.Attribute):
            chain, x = [node.attr], node.value
            while isinstance(x, ast.Attribute):
                chain.append(x.attr)
                x = x.value
            if isinstance(x, ast.Name):
                out.add(".".join([x.id] + chain[::-1]))
    return out


SPEED_CALLS = {"torch.compile", "torch.cuda.graph", "torch.cuda.CUDAGraph",
               "torch.cuda.make_graphed_callables"}


def test_the_losses_are_plain_functions_of_tensors():
    """losses.py imports torch alone and names neither torch.compile nor a CUDA graph."""
    assert "(`losses.py`: GAE" in section("The learner: plain functions, the speed around them")
    path = TRAINING / "losses.py"
    modules = {a.name for n in ast.walk(tree(path)) if isinstance(n, ast.Import)
               for a in n.names}
    modules |= {"." * n.level + (n.module or "") for n in ast.walk(tree(path))
                if isinstance(n, ast.ImportFrom)}
    assert modules <= {"torch", "__future__"}, modules
    assert not attribute_chains(path) & (SPEED_CALLS | {"torch.compiler.is_compiling"})
    assert "take" in defined(path)


def test_only_speed_compiles_or_captures():
    """torch.compile and CUDA graph capture are called in training/speed/ only."""
    assert "only `speed/` calls\ntorch.compile or captures a CUDA graph" in doc()
    users = {str(p.relative_to(ROOT)) for p in TRAINING.rglob("*.py")
             if "__pycache__" not in p.parts and attribute_chains(p) & SPEED_CALLS}
    assert users and all(u.startswith("training/speed/") for u in users), sorted(users)


def test_the_loop_names_no_algorithm():
    """loop.py names no algorithm class nor an algorithm's name: the class comes from
    `algorithm_class`."""
    table_node = next(n for n in ast.walk(tree(TRAINING / "algorithms" / "__init__.py"))
                      if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "")
                      == "ALGORITHMS")
    names = {k.value for k in table_node.value.keys}
    classes_ = {v.id for v in table_node.value.values}
    assert names and classes_
    loop = tree(TRAINING / "loop.py")
    used = {n.id for n in ast.walk(loop) if isinstance(n, ast.Name)}
    used |= {n.attr for n in ast.walk(loop) if isinstance(n, ast.Attribute)}
    strings = {n.value for n in ast.walk(loop) if isinstance(n, ast.Constant)
               and isinstance(n.value, str)}
    named = (used & classes_) | (strings & names)
    assert not named, sorted(named)
    assert "algorithm_class" in used


@pytest.mark.parametrize("claim", ["never asks which algorithm it is",
                                   "The loop does ask\nwhether the run is a population"])
def test_the_loop_claims_are_stated(claim):
    """The claims the loop tests above check are the doc's own words."""
    assert claim in section("Training")
