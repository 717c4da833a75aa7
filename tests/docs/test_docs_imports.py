"""Every import the docs show works: import lines of code blocks and of inline code in README.md and docs/*.md,
and dotted names of the project's objects written in prose (``orchestrator.service.ServiceClient(...)``)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest
from docblocks import documents, unexplained_skips

FENCED = re.compile(r"^```(?P<lang>[^\n]*)\n(?P<code>.*?)^```", re.S | re.M)
INLINE = re.compile(r"(?<!`)`(?P<code>[^`\n]+(?:\n[^`\n]+)?)`(?!`)")
IMPORT = re.compile(r"(?:^|;\s*)(?P<stmt>(?:from\s+[\w.]+\s+import\s+[\w, ()]+|import\s+[\w., ]+))")
#: ``orchestrator.a.b.Name`` or ``orchestrator.a.func(``: a module path ending in an object of the project.
DOTTED = re.compile(r"\b(?P<path>(?:orchestrator|orch_\w+)(?:\.\w+)+)(?P<call>\()?")
OURS = ("orchestrator", "plugins")


def ours(module: str) -> bool:
    return module.split(".")[0] in OURS or module.startswith("orch_")


def code_blocks(text: str) -> list[tuple[int, str, str]]:
    return [(text[: m.start()].count("\n") + 2, m.group("lang").strip(), m.group("code"))
            for m in FENCED.finditer(text)]


def import_statements(code: str) -> list[ast.Import | ast.ImportFrom]:
    """The import statements of a block, or of its import lines alone when it is a fragment."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        tree = ast.Module(body=[], type_ignores=[])
        for line in code.splitlines():
            for m in IMPORT.finditer(line.split("#")[0]):
                try:
                    tree.body.extend(ast.parse(m.group("stmt").strip().rstrip(",")).body)
                except SyntaxError:
                    continue
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


def documented_imports() -> list[tuple[str, str, str | None]]:
    """(where, module, name) for every import of the project's names in the docs."""
    found: list[tuple[str, str, str | None]] = []
    for path in documents():
        text = path.read_text()
        pieces = [(line, code) for line, lang, code in code_blocks(text) if lang in ("python", "py", "")]
        prose = FENCED.sub(lambda m: "\n" * m.group(0).count("\n"), text)
        pieces += [(prose[: m.start()].count("\n") + 1, m.group("code")) for m in INLINE.finditer(prose)]
        for line, code in pieces:
            for node in import_statements(code):
                where = f"{path.name}:{line}"
                if isinstance(node, ast.Import):
                    found += [(where, a.name, None) for a in node.names if ours(a.name)]
                elif node.module and ours(node.module):
                    found += [(where, node.module, a.name) for a in node.names]
    return found


def documented_objects() -> list[tuple[str, str]]:
    """(where, dotted path) for each ``orchestrator.x.Name`` or ``orchestrator.x.f(`` in inline code."""
    found = []
    for path in documents():
        prose = FENCED.sub(lambda m: "\n" * m.group(0).count("\n"), path.read_text())
        for m in INLINE.finditer(prose):
            for ref in DOTTED.finditer(m.group("code")):
                last = ref.group("path").rsplit(".", 1)[1]
                if last[:1].isupper() or ref.group("call"):
                    found.append((f"{path.name}:{prose[: m.start()].count(chr(10)) + 1}", ref.group("path")))
    return found


def resolve(module: str, name: str | None) -> None:
    mod = importlib.import_module(module)
    if name and name != "*" and not hasattr(mod, name):
        importlib.import_module(f"{module}.{name}")


def resolve_dotted(path: str) -> None:
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return
    raise ModuleNotFoundError(path)


def test_the_docs_show_imports_and_objects_to_check() -> None:
    assert len(documented_imports()) > 40 and len(documented_objects()) > 5


@pytest.mark.parametrize(("where", "module", "name"), documented_imports(), ids=lambda v: str(v))
def test_a_documented_import_works(where: str, module: str, name: str | None) -> None:
    try:
        resolve(module, name)
    except Exception as exc:  # noqa: BLE001 (any failure to import is the finding)
        pytest.fail(f"{where}: from {module} import {name}: {type(exc).__name__}: {exc}")


@pytest.mark.parametrize(("where", "path"), documented_objects(), ids=lambda v: str(v))
def test_a_documented_object_exists(where: str, path: str) -> None:
    try:
        resolve_dotted(path)
    except Exception as exc:  # noqa: BLE001
        pytest.fail(f"{where}: {path}: {type(exc).__name__}: {exc}")


@pytest.mark.parametrize("path", documents(), ids=lambda p: p.name)
def test_every_skipped_block_says_why_to_the_reader(path: Path) -> None:
    assert unexplained_skips(path.read_text()) == [], "a skip directive without '(illustration, not run: ...)'"


@pytest.mark.parametrize("path", documents(), ids=lambda p: p.name)
def test_every_block_is_run_or_plainly_prose(path: Path) -> None:
    """A block's language says what the docs tests do with it: run (python, sh), parse (toml, json), or nothing
    (``text`` for output, no language for diagrams); any other language would be passed over unseen."""
    from docblocks import LANGUAGES

    unknown = [(line, lang) for line, lang, _ in code_blocks(path.read_text())
               if lang not in LANGUAGES and lang not in ("", "text")]
    assert unknown == [], f"blocks in a language the docs tests neither run nor parse: {unknown}"
