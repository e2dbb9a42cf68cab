"""mlsl_tf's Python stays readable in pieces (issue #45): no function over MAX_FUNCTION_LINES
lines (its def line to its last line, docstring and nested functions included) and no file over
MAX_FILE_LINES lines."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "mlsl_tf"
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 450


def long_functions(path, limit=MAX_FUNCTION_LINES):
    """'file:line name (n lines)' for each function of the file at `path` longer than `limit`."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > limit:
                out.append(f"{path.name}:{node.lineno} {node.name} ({n} lines)")
    return out


def line_count(path):
    return len(path.read_text().splitlines())


def test_no_function_is_longer_than_the_limit():
    long = [f for path in sorted(PACKAGE.rglob("*.py")) for f in long_functions(path)]
    assert long == [], f"functions over {MAX_FUNCTION_LINES} lines (split them): {long}"


def test_no_file_is_longer_than_the_limit():
    long = [f"{p.relative_to(PACKAGE.parent)} ({line_count(p)} lines)" for p in sorted(PACKAGE.rglob("*.py"))
            if line_count(p) > MAX_FILE_LINES]
    assert long == [], f"files over {MAX_FILE_LINES} lines (split them): {long}"


def test_the_checks_see_a_long_function_and_a_long_file(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES - 1))
    fits = tmp_path / "fits.py"
    fits.write_text(f"def f():\n{body}\n")  # exactly the limit
    assert long_functions(fits) == []
    too_long = tmp_path / "too_long.py"
    too_long.write_text(f"class C:\n    def m(self):\n    {body.replace(chr(10), chr(10) + '    ')}\n        y = 0\n")
    assert long_functions(too_long) == [f"too_long.py:2 m ({MAX_FUNCTION_LINES + 1} lines)"]
    big = tmp_path / "big.py"
    big.write_text("x = 0\n" * (MAX_FILE_LINES + 1))
    assert line_count(big) == MAX_FILE_LINES + 1
