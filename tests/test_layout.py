"""The layout of the top-level files: imports point down the pipeline, nothing imports in a circle, each file's
docstring says truly which siblings it needs, and every `>>>` example runs.

The rule (the design's layers, lowest first): a file may import a sibling on its own layer or below, never one
above it, and no set of files may import each other in a circle. Imports inside functions count, because a
function that imports train.py makes its file need train.py as surely as a line at the top does. Two places are
exempt, because nothing imports them: the body of a function named `main`, and the block under
`if __name__ == "__main__":`. A CLI may wire every file together there.

Worked example on a toy tree (what `sibling_imports` sees):

    model.py   import torch                      -> no sibling
               def load_hf(): import bpe         -> bpe  (a function-level import counts)
               def main(): import train          -> exempt (main may import anything)

so model.py's docstring must say `Depends on: ... bpe.py ...` and name no other sibling, bpe (layer 2) sits below
model (layer 5), and the edge model -> bpe can close no cycle unless bpe imports model.

The docstring form that is checked: the paragraph of the module docstring that begins with "Depends on" (up to the
next blank line) names, as `NAME.py`, exactly the siblings the file imports outside main; a file that imports none
names none there ("Depends on numpy and the standard library only (no sibling files)."). Who uses a file, or what
its tests and demos import, is said elsewhere in the docstring, so every `NAME.py` in that paragraph is a claim.
"""
from __future__ import annotations

import ast
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

# The pipeline, lowest layer first (a file may import its own layer and those below). Every top-level .py file
# must be here, so a new file cannot slip past the rule: test_every_top_level_file_has_a_layer says which is missing.
LAYERS = {
    "fileio": 0,           # untrusted JSON, atomic writes: the standard library only
    "cli": 0,              # the CLI helpers (parser, argparse types, exit 2): main() imports it
    "store": 1,            # object-store I/O (s3://, gs://, hdfs://) for the data engine
    "classify_corpora": 1,  # the language identifier's text: gettext catalogs read from packages' wheels
    "bpe": 2,
    "dedup": 2,
    "classify": 2,         # the fastText-style language and quality classifiers of data.py's funnel
    "formats": 2,          # the file formats data.py's sources are read from (.txt, .jsonl, .parquet, ...), DataError
    "data": 3,             # the lesson on in-memory lists; the reference engine
    "dataset": 4,          # data.py's prepare: the recipe checked, its cache key, the directory published
    "data_at_scale": 4,    # the streaming and Ray engines of data.py (imports dataset.py, its own layer)
    "model": 5,
    "parallel": 6,         # many copies of one model: DP, ZeRO
    "model_parallel": 7,   # one model cut into pieces: TP, PP, EP, CP
    "train": 8,
    "evaluate": 9,
    "hf": 9,               # the Hugging Face bridge: model + the checkpoint format of train
    "scaling": 10,
    "sweep": 11,           # the IsoFLOP sweep and the dedup-effect experiment
}


def top_level_files(root: pathlib.Path = ROOT) -> list[str]:
    return sorted(p.stem for p in root.glob("*.py"))


def _is_main_guard(node: ast.AST) -> bool:
    """`if __name__ == "__main__":` (either side of the ==)."""
    if not (isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and len(node.test.ops) == 1
            and isinstance(node.test.ops[0], ast.Eq)):
        return False
    sides = [node.test.left, *node.test.comparators]
    return (any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)
            and any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides))


def _imported_names(node: ast.AST) -> list[str]:
    """The top-level module names one statement or call imports: `import a.b` -> a, `from a import b` -> a,
    `importlib.import_module("a")` / `__import__("a")` -> a. Relative imports name no sibling here (flat layout)."""
    if isinstance(node, ast.Import):
        return [alias.name.split(".")[0] for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        return [node.module.split(".")[0]] if node.module and node.level == 0 else []
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
            and isinstance(node.args[0].value, str):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name in ("import_module", "__import__"):
            return [node.args[0].value.split(".")[0]]
    return []


def sibling_imports(source: str, siblings: set[str], self_name: str) -> dict[str, list[int]]:
    """{sibling: [line numbers]} that `source` imports outside `main()` and the __main__ block.

    >>> code = "import os\\nimport bpe\\ndef f():\\n    from train import x\\ndef main():\\n    import scaling\\n"
    >>> sibling_imports(code, {"bpe", "train", "scaling"}, "model")
    {'bpe': [2], 'train': [4]}
    >>> sibling_imports('if __name__ == "__main__":\\n    import model\\n    model.main()\\n', {"model"}, "model")
    {}
    """
    found: dict[str, list[int]] = {}

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and child.name == "main":
                continue
            if _is_main_guard(child):
                for orelse in child.orelse:          # an `else:` under the guard runs on import
                    visit_one(orelse)
                continue
            visit_one(child)

    def visit_one(child: ast.AST) -> None:
        for name in _imported_names(child):
            if name in siblings and name != self_name:
                found.setdefault(name, []).append(child.lineno)
        visit(child)

    visit(ast.parse(source))
    return found


def import_graph(root: pathlib.Path = ROOT) -> dict[str, dict[str, list[int]]]:
    """{file: {sibling it imports outside main: [lines]}} over every top-level .py file."""
    files = top_level_files(root)
    return {f: sibling_imports((root / f"{f}.py").read_text(encoding="utf-8"), set(files), f) for f in files}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None (depth-first search, white/grey/black).

    >>> find_cycle({"data": {"evaluate"}, "evaluate": {"train"}, "train": {"data"}})
    ['data', 'evaluate', 'train', 'data']
    >>> find_cycle({"train": {"data", "model"}, "data": set(), "model": set()}) is None
    True
    """
    state: dict[str, int] = {}                      # absent: unseen, 1: on the current path, 2: finished
    path: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := dfs(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := dfs(start)):
            return cycle
    return None


def depends_on_paragraph(docstring: str) -> str | None:
    """The paragraph of a docstring that begins with "Depends on" (to the next blank line), or None.

    >>> depends_on_paragraph("Title.\\n\\nDepends on: torch and\\nbpe.py (the tokenizer).\\n\\nMore.")
    'Depends on: torch and\\nbpe.py (the tokenizer).'
    """
    for paragraph in re.split(r"\n\s*\n", docstring):
        if paragraph.strip().startswith("Depends on"):
            return paragraph.strip()
    return None


def named_siblings(paragraph: str) -> set[str]:
    """The `NAME.py` files a paragraph names.
    >>> sorted(named_siblings("Depends on: numpy, bpe.py (train_bpe) and dedup.py; pydoc_data.topics is stdlib."))
    ['bpe', 'dedup']
    """
    return set(re.findall(r"(?<![\w.])([A-Za-z_]\w*)\.py\b", paragraph))


def unknown_files(root: pathlib.Path = ROOT) -> list[str]:
    """Top-level files LAYERS does not place, each with the fix."""
    return [f"{f}.py has no layer: add it to LAYERS in tests/test_layout.py at its place in the pipeline"
            for f in top_level_files(root) if f not in LAYERS]


def cycle_problems(root: pathlib.Path = ROOT) -> list[str]:
    cycle = find_cycle({f: set(deps) for f, deps in import_graph(root).items()})
    return [] if cycle is None else ["import cycle (outside main()): " + " -> ".join(f"{f}.py" for f in cycle)
                                     + ": move the shared code down a layer, or the import into main()"]


def upward_imports(root: pathlib.Path = ROOT) -> list[str]:
    return [f"{f}.py line {lines[0]} imports {dep}.py, a layer above it ({LAYERS[f]} < {LAYERS[dep]}): move the "
            "import into main() or the code it needs down"
            for f, deps in import_graph(root).items() for dep, lines in deps.items()
            if f in LAYERS and dep in LAYERS and LAYERS[dep] > LAYERS[f]]


def docstring_problems(root: pathlib.Path = ROOT) -> list[str]:
    """Files whose "Depends on" paragraph is missing or does not name exactly the siblings they import."""
    wrong = []
    for f, deps in import_graph(root).items():
        doc = ast.get_docstring(ast.parse((root / f"{f}.py").read_text(encoding="utf-8"))) or ""
        paragraph = depends_on_paragraph(doc)
        if paragraph is None:
            wrong.append(f"{f}.py: its docstring has no paragraph starting 'Depends on'")
            continue
        named, imported = named_siblings(paragraph), set(deps)
        if named != imported:
            missing, extra = sorted(imported - named), sorted(named - imported)
            wrong.append(f"{f}.py: 'Depends on' names {sorted(named) or 'no sibling'}, but it imports "
                         f"{sorted(imported) or 'none'} outside main()"
                         + (f"; add {', '.join(m + '.py' for m in missing)}" if missing else "")
                         + (f"; drop {', '.join(e + '.py' for e in extra)}" if extra else ""))
    return wrong


RULES = {                                    # test id -> the check that lists the tree's breaches of that rule
    "every_top_level_file_has_a_layer": unknown_files,
    "no_import_cycle": cycle_problems,
    "imports_point_down_the_pipeline": upward_imports,
    "depends_on_line_names_exactly_the_imported_siblings": docstring_problems,
}


@pytest.mark.parametrize("check", RULES.values(), ids=RULES.keys())
def test_the_tree_keeps_the_rule(check):
    problems = check()
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_every_docstring_example_runs():
    """`python -m pytest --doctest-modules` over every top-level file, in a child process (a clean interpreter)."""
    files = [f"{f}.py" for f in top_level_files()]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, "-m", "pytest", "--doctest-modules", "-q", "-p", "no:cacheprovider",
                           *files], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"doctests failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}"


# The checker itself, on toy trees (these run unmarked: a checker that sees nothing would pass every rule above).

def write_tree(root: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    for name, text in files.items():
        (root / f"{name}.py").write_text(text, encoding="utf-8")
    return root


GOOD_TREE = {
    "bpe": '"""Tokenizer.\n\nDepends on the standard library only (no sibling files)."""\n',
    "model": '"""GPT.\n\nDepends on: torch and bpe.py (for load_hf).\n\nUsed by train.py."""\n'
             "import torch\ndef load_hf():\n    import bpe\ndef main():\n    import train\n",
    "train": '"""Loop.\n\nDepends on: model.py and\nbpe.py."""\nimport model\nfrom bpe import Tokenizer\n'
             'if __name__ == "__main__":\n    import scaling\n',
    "scaling": '"""Laws.\n\nDepends on: train.py (the sweep)."""\ndef sweep():\n    import importlib\n'
               '    importlib.import_module("train")\n',
}


def test_checker_passes_a_good_tree(tmp_path):
    root = write_tree(tmp_path, GOOD_TREE)
    assert import_graph(root) == {"bpe": {}, "model": {"bpe": [8]}, "train": {"model": [5], "bpe": [6]},
                                  "scaling": {"train": [6]}}
    assert (unknown_files(root), cycle_problems(root), upward_imports(root), docstring_problems(root)) == \
        ([], [], [], [])


def test_checker_finds_a_function_level_cycle(tmp_path):
    """The issue's cycle, data -> evaluate -> train -> data, with evaluate's import inside a function."""
    root = write_tree(tmp_path, {
        "data": '"""D.\n\nDepends on: evaluate.py."""\ndef val_overlap():\n    import evaluate\n',
        "evaluate": '"""E.\n\nDepends on: train.py."""\nimport train\n',
        "train": '"""T.\n\nDepends on: data.py."""\nimport data\n'})
    assert cycle_problems(root) == ["import cycle (outside main()): data.py -> evaluate.py -> train.py -> data.py: "
                                    "move the shared code down a layer, or the import into main()"]
    assert upward_imports(root) == ["data.py line 5 imports evaluate.py, a layer above it (3 < 9): move the import "
                                    "into main() or the code it needs down"]


def test_checker_exempts_only_main(tmp_path):
    """An import in a CLI helper that is not main() counts; the same import inside main() does not."""
    helper = '"""M.\n\nDepends on: torch."""\ndef cmd_export():\n    import train\n'
    in_main = '"""M.\n\nDepends on: torch."""\ndef main():\n    def run():\n        import train\n'
    train = '"""T.\n\nDepends on: model.py."""\nimport model\n'
    (tmp_path / "helper").mkdir()
    (tmp_path / "in_main").mkdir()
    assert cycle_problems(write_tree(tmp_path / "helper", {"model": helper, "train": train}))
    assert not cycle_problems(write_tree(tmp_path / "in_main", {"model": in_main, "train": train}))


def test_checker_finds_an_untrue_depends_on_line(tmp_path):
    root = write_tree(tmp_path, {
        "bpe": '"""B."""\n',
        "dedup": '"""D.\n\nDepends on numpy (no sibling files)."""\nimport bpe\n',
        "parallel": '"""P.\n\nDepends on: torch (its demos use model.py)."""\n',
        "model": '"""M.\n\nDepends on torch only."""\n'})
    assert docstring_problems(root) == [
        "bpe.py: its docstring has no paragraph starting 'Depends on'",
        "dedup.py: 'Depends on' names no sibling, but it imports ['bpe'] outside main(); add bpe.py",
        "parallel.py: 'Depends on' names ['model'], but it imports none outside main(); drop model.py"]


def test_checker_names_a_file_with_no_layer(tmp_path):
    root = write_tree(tmp_path, {"bpe": '"""B.\n\nDepends on nothing."""\n', "tensor_parallel": '"""TP."""\n'})
    assert unknown_files(root) == ["tensor_parallel.py has no layer: add it to LAYERS in tests/test_layout.py at "
                                   "its place in the pipeline"]


def test_checker_docstring_examples():
    import doctest
    assert doctest.testmod(sys.modules[__name__]).failed == 0
