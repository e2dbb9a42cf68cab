"""The C++ core stays readable by size: no file over 450 lines, no function over 60, no class or
struct with more than 20 data members, and the Engine with at most 15 of its own (it wires parts
that own their state). A small C++ reader (comments and strings dropped, braces classified by
what opens them) measures ops/core; its own tests plant each kind of excess."""

import pathlib
import re

CORE = pathlib.Path(__file__).resolve().parents[2] / "ops" / "core"
MAX_FILE_LINES = 450
MAX_FUNCTION_LINES = 60
MAX_MEMBERS = 20
MAX_ENGINE_MEMBERS = 15


def _strip(text):
    """The source with comments, string and character literals blanked (newlines kept)."""
    pattern = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
    return pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def _top_level_commas(statement):
    depth, commas = 0, 0
    for ch in statement:
        if ch in "(<{[":
            depth += 1
        elif ch in ")>}]":
            depth -= 1
        elif ch == "," and depth == 0:
            commas += 1
    return commas


def _is_data_member(statement):
    s = re.sub(r"\b(public|private|protected)\s*:", " ", statement).strip()
    if not s or re.match(r"(using|typedef|friend|static|enum|template|class|struct)\b", s):
        return 0
    while re.search(r"<[^<>]*>", s):  # std::function<void(int)> is a type, not a call
        s = re.sub(r"<[^<>]*>", "T", s)
    if "(" in re.split(r"=|\{", s, maxsplit=1)[0] or "operator" in s:
        return 0
    return _top_level_commas(s) + 1


def measure(text):
    """(functions, classes): [(name, lines)] for every function body, and
    [(name, data members)] for every class or struct."""
    src = _strip(text)
    functions, classes = [], []
    stack = []  # (kind, name, start line, members)
    statement, start_line, line = "", None, 1
    for ch in src:
        if ch == "\n":
            line += 1
        if ch == "{":
            head = statement.strip()
            in_function = any(k == "function" for k, *_ in stack)
            m = re.search(r"\b(class|struct|union)\s+([\w:]+)[^;()]*$", head)
            if re.search(r"\bnamespace\b", head) or head.startswith('extern'):
                stack.append(["namespace", "", line, 0])
            elif re.search(r"\benum\b", head):
                stack.append(["enum", "", line, 0])
            elif m and not in_function and "=" not in head:
                stack.append(["class", m.group(2), line, 0])
            elif not in_function and ")" in head and not re.search(r"=\s*$", head) and \
                    (not stack or stack[-1][0] in ("namespace", "class")):
                name = re.findall(r"([~\w:]+)\s*\(", head)
                stack.append(["function", name[0] if name else "?", start_line or line, 0])
            else:
                stack.append(["block", "", line, 0])
            statement, start_line = "", None
        elif ch == "}":
            if stack:
                kind, name, first, members = stack.pop()
                if kind == "function":
                    functions.append((name, line - first + 1))
                elif kind == "class":
                    classes.append((name, members))
            statement, start_line = "", None
        elif ch == ";":
            if stack and stack[-1][0] == "class":
                stack[-1][3] += _is_data_member(statement)
            statement, start_line = "", None
        else:
            if not ch.isspace() and start_line is None:
                start_line = line
            statement += ch
            if ch == ":" and re.search(r"\b(public|private|protected)\s*:$", statement):
                statement, start_line = "", None
    return functions, classes


def _core_files():
    return sorted(p for p in CORE.rglob("*") if p.suffix in (".h", ".cc") and "tests" not in p.parts)


def test_no_core_file_is_too_long():
    long = [f"{p.relative_to(CORE)}: {n}" for p in _core_files()
            if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES]
    assert not long, f"ops/core files over {MAX_FILE_LINES} lines: {long}"


def test_no_core_function_is_too_long():
    long = [f"{p.relative_to(CORE)}: {name} ({n} lines)" for p in _core_files()
            for name, n in measure(p.read_text())[0] if n > MAX_FUNCTION_LINES]
    assert not long, f"ops/core functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_no_core_class_has_too_many_members():
    big, engine = [], None
    for p in _core_files():
        for name, members in measure(p.read_text())[1]:
            if members > MAX_MEMBERS:
                big.append(f"{p.relative_to(CORE)}: {name} ({members})")
            if name == "Engine" and p.name == "engine.h":
                engine = members
    assert not big, f"ops/core classes with over {MAX_MEMBERS} data members: {big}"
    assert engine is not None, "engine.h no longer defines class Engine"
    assert engine <= MAX_ENGINE_MEMBERS, f"Engine has {engine} data members of its own (at most {MAX_ENGINE_MEMBERS})"


def test_the_reader_counts_members_and_function_lines():
    source = """
    // class Fake { int commented_out; };
    namespace mlsl {
    struct Options { int a = 0, b = 1; std::function<void(int)> done; static constexpr int kMax = 3;
                     void Reset(); bool ok() const { return a > 0; } };
    class Engine {
     public:
      explicit Engine(int x) : a_(x) {}
      int Size() const;
     private:
      enum class Phase { kIdle, kBusy } phase_ = Phase::kIdle;
      std::map<std::string, std::vector<int>> table_;
      int a_ = 0;
      const char* text_ = "}";
    };
    int Engine::Size() const {
      if (a_ > 0) {
        return a_;
      }
      return 0;
    }
    }  // namespace mlsl
    """
    functions, classes = measure(source)
    assert dict(classes) == {"Options": 3, "Engine": 4}
    assert ("Engine::Size", 6) in functions
    assert ("ok", 1) in functions


def test_the_checks_see_a_planted_excess(tmp_path, monkeypatch):
    body = "\n".join(f"  x += {i};" for i in range(MAX_FUNCTION_LINES))
    members = "\n".join(f"  int m{i};" for i in range(MAX_MEMBERS + 1))
    (tmp_path / "big.cc").write_text(f"void Long() {{\n{body}\n}}\nstruct Wide {{\n{members}\n}};\n")
    monkeypatch.setattr(__import__(__name__), "CORE", tmp_path)
    for check in (test_no_core_function_is_too_long, test_no_core_class_has_too_many_members):
        try:
            check()
        except AssertionError as e:
            assert "Long" in str(e) or "Wide" in str(e), e
        else:
            raise AssertionError(f"{check.__name__} passed over a planted excess")
