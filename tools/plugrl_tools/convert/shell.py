"""Reading a bash launch script without running it: the variables it sets and the commands it
would run, with the expansions launch scripts use evaluated.

Evaluated: ``NAME=value``; ``export``/``declare``/``local``/``readonly`` ``NAME=value``;
``unset NAME``; ``$NAME``, ``${NAME}``, ``${NAME:-default}`` (and ``-``, ``:=``, ``=``, ``:+``,
``+``); ``${1:-default}`` (the default: the script's arguments are not known); arrays
(``NAME=(...)``, ``NAME+=(...)``, ``"${NAME[@]}"``, ``${NAME[0]}``); ``$((integer
arithmetic))``; ``$(pwd)`` as ``$PWD``; single and double quotes, backslashes, line
continuations, comments, redirections and pipes; ``if [ A = B ]; then ... elif ... else ...
fi`` with the tests ``=``, ``==``, ``!=``, ``-z`` and ``-n``; ``case WORD in PATTERN|...) ... ;;
esac`` with glob patterns. :attr:`Script.notes` names the branch each decided ``if`` and ``case``
took.

Nothing is run. A value the script cannot give without running something (``$(date)``), a
variable it never sets, or one assigned in a loop or under a condition that cannot be decided
here is :class:`Unresolved`, with the reason.
"""

from __future__ import annotations

import ast
import fnmatch
import operator
import re
from collections.abc import Mapping
from typing import Union

import attrs

from plugrl.errors import ConvertError

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_ASSIGNMENT = re.compile(rf"({_NAME})(\+?)=")
_REDIRECTION = re.compile(r"\d*(&>>|&>|>>|>&|<&|<<<|<<-|<<|>\||>|<)")
_WORD_END = " \t\r\n;&|<>"
CASE_END = ";;"
"""The source the lexer gives the mark it puts where a ``case`` branch ends (``;;``, ``;&``,
``;;&``)."""


@attrs.frozen
class Unresolved:
    """A value the converter cannot know without running the script."""

    reason: str
    shown: str = attrs.field(default="", eq=False)
    """The value as far as it expands, each expansion that does not written as in the script
    (``$RAY_DATA_HOME/data/train.parquet``); empty: the expansion's own source."""


Value = Union[str, Unresolved]  # noqa: UP007 (a runtime alias on Python 3.10)


@attrs.frozen
class Word:
    """One word of a command, expanded and unquoted.

    ``text`` shows each unresolved expansion as it was written (``${MODEL_PATH}``), and
    ``unresolved`` says why it could not be expanded.
    """

    text: str
    source: str
    line: int
    unresolved: tuple[str, ...] = ()


@attrs.frozen
class Command:
    """A simple command the script would run (not an assignment or a keyword)."""

    words: tuple[Word, ...]
    line: int
    environment: tuple[tuple[str, Value], ...] = ()
    """``NAME=value`` words before the command name: its own environment."""
    conditional: bool = False
    """The command sits in a loop or under a condition the converter cannot decide."""
    passes_arguments: bool = False
    """The command passes on the script's own arguments (``$@``)."""
    comment_lines: tuple[int, ...] = ()
    """Comment lines inside the command. bash ends a command at a comment line, even one
    ending in a backslash; they are read here as the layout means them: the command goes on
    after them."""


@attrs.define
class Script:
    """What reading a script found."""

    variables: dict[str, Value]
    exported: list[str]
    commands: list[Command]
    notes: list[str]
    inherited: dict[str, str] = attrs.field(factory=dict)
    """Variables of ``inherited`` the script read without setting them, with their values."""


def read_script(
    text: str,
    env: Mapping[str, str] | None = None,
    inherited: Mapping[str, str] | None = None,
) -> Script:
    """Evaluate the assignments of a bash script and collect its commands, running nothing.

    ``env`` gives variables the script reads but does not set (as if exported before it ran).
    ``inherited`` gives more such variables, of lower rank (``HOME`` of the machine that
    converts): :attr:`Script.inherited` says which of them the script read.
    """
    evaluator = _Evaluator(env or {}, inherited or {})
    for words, comment_lines in _Lexer(text).commands():
        evaluator.command(words, tuple(comment_lines))
    return Script(
        evaluator.variables,
        evaluator.exported,
        evaluator.commands,
        evaluator.notes,
        evaluator.inherited_read,
    )


# ---------------------------------------------------------------------------------- lexing


@attrs.frozen
class _Lit:
    text: str
    quoted: bool


@attrs.frozen
class _Param:
    """``$NAME`` or ``${NAME<op><arg>}``."""

    name: str
    op: str
    arg: tuple[object, ...]
    quoted: bool
    source: str


@attrs.frozen
class _Arith:
    parts: tuple[object, ...]
    quoted: bool
    source: str


@attrs.frozen
class _ArrayRef:
    """``${NAME[@]}``, ``${NAME[*]}`` or ``${NAME[index]}``."""

    name: str
    index: str
    quoted: bool
    source: str


@attrs.frozen
class _Array:
    """``NAME=(element ...)``: the elements as words, expanded when assigned."""

    elements: tuple[_RawWord, ...]
    source: str


@attrs.frozen
class _Opaque:
    """Something written that the converter does not evaluate (a command substitution)."""

    source: str
    reason: str


@attrs.frozen
class _PathPart:
    """``$(basename WORD)`` or ``$(dirname WORD)``: computed here as the command would (it
    reads only its argument), not run."""

    command: str
    word: _RawWord
    quoted: bool
    source: str


@attrs.frozen
class _RawWord:
    parts: tuple[object, ...]
    source: str
    line: int


def _shorten(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 40 else text[:37] + "..."


class _Lexer:
    """Splits script text into commands of words, each word a list of parts."""

    def __init__(self, text: str, line: int = 1) -> None:
        self.text = text
        self.i = 0
        self.line = line
        self.heredocs: list[tuple[str, bool]] = []

    def peek(self, offset: int = 0) -> str:
        j = self.i + offset
        return self.text[j] if j < len(self.text) else ""

    def commands(self) -> list[tuple[list[_RawWord], list[int]]]:
        """The commands: their words, and the lines of comments inside them (see below)."""
        commands: list[tuple[list[_RawWord], list[int]]] = []
        words: list[_RawWord] = []
        comments: list[int] = []
        continued = False  # this line continues the command of the line before
        while self.i < len(self.text):
            c = self.peek()
            if c in " \t\r":
                self.i += 1
            elif c == "\\" and self.peek(1) == "\n":
                self.i += 2
                self.line += 1
                continued = True
            elif c == "#":
                whole_line = self.text[self.text.rfind("\n", 0, self.i) + 1 : self.i].strip() == ""
                while self.i < len(self.text) and self.peek() != "\n":
                    self.i += 1
                # A comment line inside a command that runs over several lines ends the
                # command in bash; the lines after it are meant as part of the command, and
                # read so. The caller says so wherever it matters.
                if words and continued and whole_line and self.peek() == "\n":
                    comments.append(self.line)
                    self.i += 1
                    self.line += 1
            elif c == "\n":
                if words:
                    commands.append((words, comments))
                    words, comments = [], []
                self.i += 1
                self.line += 1
                continued = False
                self._skip_heredocs()
            elif self._redirection():
                continue
            elif c == ";" and self.peek(1) in (";", "&") and self.peek(1):
                # the end of a case branch: a command of its own, which no word can be
                if words:
                    commands.append((words, comments))
                    words, comments = [], []
                end = 3 if self.text.startswith(";;&", self.i) else 2
                mark = self.text[self.i : self.i + end]
                commands.append(([_RawWord((_Lit(mark, False),), CASE_END, self.line)], []))
                self.i += end
            elif c in ";&|":
                if words:
                    commands.append((words, comments))
                    words, comments = [], []
                self.i += 2 if self.peek(1) in ";&|" and self.peek(1) else 1
            else:
                words.append(self.word())
        if words:
            commands.append((words, comments))
        return commands

    def _redirection(self) -> bool:
        match = _REDIRECTION.match(self.text, self.i)
        if not match:
            return False
        self.i = match.end()
        op = match.group(1)
        if op in (">&", "<&") and re.match(r"[0-9-]", self.peek()):
            while re.match(r"[0-9-]", self.peek()):
                self.i += 1
            return True
        while self.peek() in (" ", "\t"):
            self.i += 1
        if not self.peek() or self.peek() in "\n;&|":
            return True
        target = self.word()
        if op in ("<<", "<<-"):
            delimiter = "".join(p.text for p in target.parts if isinstance(p, _Lit))
            self.heredocs.append((delimiter, op == "<<-"))
        return True

    def _skip_heredocs(self) -> None:
        while self.heredocs:
            delimiter, strip_tabs = self.heredocs.pop(0)
            while self.i < len(self.text):
                end = self.text.find("\n", self.i)
                end = len(self.text) if end < 0 else end
                body_line = self.text[self.i : end]
                self.i = end + 1
                self.line += 1
                if (body_line.lstrip("\t") if strip_tabs else body_line) == delimiter:
                    break

    def word(self, stop: str = _WORD_END) -> _RawWord:
        """One word from here; ``stop`` are the characters that end it unquoted (none: the
        rest of the text, for the inside of ``${NAME:-...}`` and ``$((...))``)."""
        start, line = self.i, self.line
        parts: list[object] = []
        literal: list[str] = []

        def flush() -> None:
            if literal:
                parts.append(_Lit("".join(literal), False))
                literal.clear()

        while self.i < len(self.text):
            c = self.peek()
            if c in stop:
                break
            if c == "\\":
                following = self.peek(1)
                if following == "\n":
                    self.i += 2
                    self.line += 1
                    continue
                flush()
                parts.append(_Lit(following, True))
                self.i += 2
            elif c == "'":
                flush()
                parts.append(_Lit(self._single_quoted(), True))
            elif c == '"':
                flush()
                parts.extend(self._double_quoted())
            elif c == "$":
                flush()
                parts.append(self._dollar(quoted=False))
            elif c == "`":
                flush()
                parts.append(self._backquoted())
            elif c == "~" and self.i == start and self.peek(1) in ("/", "", *stop):
                parts.append(_Param("HOME", "", (), True, "~"))
                self.i += 1
            elif c == "(" and not parts and _ASSIGNMENT.fullmatch("".join(literal)):
                flush()
                parts.append(self._array())
            else:
                literal.append(c)
                self.i += 1
        flush()
        return _RawWord(tuple(parts), self.text[start : self.i], line)

    def _array(self) -> _Array:
        """``(element ...)`` after ``NAME=``: words over any number of lines, with comments
        (whose quotes and parentheses are only text) between them."""
        begin, line = self.i, self.line
        self.i += 1
        elements: list[_RawWord] = []
        while True:
            c = self.peek()
            if not c:
                raise ConvertError(f"line {line}: an array's '(' is never closed by ')'")
            if c == ")":
                self.i += 1
                break
            if c in " \t\r":
                self.i += 1
            elif c == "\n":
                self.i += 1
                self.line += 1
            elif c == "\\" and self.peek(1) == "\n":
                self.i += 2
                self.line += 1
            elif c == "#":
                while self.peek() and self.peek() != "\n":
                    self.i += 1
            else:
                elements.append(self.word(stop=" \t\r\n)"))
        return _Array(tuple(elements), self.text[begin : self.i])

    def _single_quoted(self) -> str:
        end = self.text.find("'", self.i + 1)
        if end < 0:
            raise ConvertError(f"line {self.line}: a ' quote is never closed")
        body = self.text[self.i + 1 : end]
        self.line += body.count("\n")
        self.i = end + 1
        return body

    def _double_quoted(self) -> list[object]:
        line = self.line
        self.i += 1
        parts: list[object] = []
        literal: list[str] = []
        while True:
            c = self.peek()
            if not c:
                raise ConvertError(f'line {line}: a " quote is never closed')
            if c == '"':
                self.i += 1
                break
            if c == "\\" and self.peek(1) in ('"', "\\", "$", "`", "\n"):
                if self.peek(1) == "\n":
                    self.line += 1
                else:
                    literal.append(self.peek(1))
                self.i += 2
            elif c in "$`":
                if literal:
                    parts.append(_Lit("".join(literal), True))
                    literal = []
                parts.append(self._dollar(quoted=True) if c == "$" else self._backquoted())
            else:
                self.line += c == "\n"
                literal.append(c)
                self.i += 1
        # "" is a word of its own: an empty quoted part keeps it
        parts.append(_Lit("".join(literal), True))
        return parts

    def _closing(self, j: int, opening: str, closing: str) -> int:
        """Index of the ``closing`` that balances an ``opening`` just before ``j``."""
        depth = 0
        while j < len(self.text):
            c = self.text[j]
            if c == "\\":
                j += 2
                continue
            if c in "'\"":
                end = self.text.find(c, j + 1)
                j = len(self.text) if end < 0 else end + 1
                continue
            if c == opening:
                depth += 1
            elif c == closing:
                if depth == 0:
                    return j
                depth -= 1
            j += 1
        raise ConvertError(f"line {self.line}: a {opening!r} is never closed by {closing!r}")

    def _backquoted(self) -> _Opaque:
        end = self.text.find("`", self.i + 1)
        if end < 0:
            raise ConvertError(f"line {self.line}: a ` quote is never closed")
        source = self.text[self.i : end + 1]
        self.line += source.count("\n")
        self.i = end + 1
        return _Opaque(source, f"{_shorten(source)} runs a command, and nothing is run here")

    def _dollar(self, quoted: bool) -> object:
        start = self.i
        following = self.peek(1)
        if following == "(" and self.peek(2) == "(":
            close = self._closing(self.i + 3, "(", ")")
            if self.text[close + 1 : close + 2] == ")":
                inner = self.text[self.i + 3 : close]
                self.i = close + 2
                parts = _Lexer(inner, self.line).word(stop="").parts
                return _Arith(parts, quoted, self.text[start : self.i])
        if following == "(":
            close = self._closing(self.i + 2, "(", ")")
            self.i = close + 1
            source = self.text[start : self.i]
            if re.fullmatch(r"\$\(\s*pwd\s*\)", source):
                return _Param("PWD", "", (), quoted, source)  # what bash keeps in $PWD
            path_command = re.fullmatch(
                r"\$\(\s*(basename|dirname)\s+(.*?)\s*\)", source, re.DOTALL
            )
            if path_command and path_command.group(1) in ("basename", "dirname"):
                inner = _Lexer(path_command.group(2), self.line).commands()
                if len(inner) == 1 and len(inner[0][0]) == 1:
                    return _PathPart(path_command.group(1), inner[0][0][0], quoted, source)
            self.line += source.count("\n")
            return _Opaque(source, f"{_shorten(source)} runs a command, and nothing is run here")
        if following == "{":
            close = self._closing(self.i + 2, "{", "}")
            self.i = close + 1
            return self._braced(self.text[start + 2 : close], quoted, self.text[start : self.i])
        match = re.match(rf"{_NAME}|[0-9@*#?$!-]", self.text[self.i + 1 : self.i + 1 + 256])
        if match:
            self.i += 1 + match.end()
            return _Param(match.group(), "", (), quoted, self.text[start : self.i])
        self.i += 1
        return _Lit("$", quoted)

    def _braced(self, inner: str, quoted: bool, source: str) -> object:
        match = re.fullmatch(rf"({_NAME}|[0-9]+|[@*#?$!-])(.*)", inner, re.DOTALL)
        if (inner.startswith("#") and len(inner) > 1) or not match:
            return _Opaque(source, f"{source} is not an expansion evaluated here")
        name, rest = match.groups()
        if not rest:
            return _Param(name, "", (), quoted, source)
        element = re.fullmatch(r"\[([@*]|[0-9]+)\]", rest)
        if element and re.fullmatch(_NAME, name):
            return _ArrayRef(name, element.group(1), quoted, source)
        if name in ("@", "*") and re.fullmatch(r":[0-9]+(:[0-9]+)?", rest):
            return _Param(name, "", (), quoted, source)  # some of the script's arguments
        if rest in (",,", "^^", ",", "^") and re.fullmatch(_NAME, name):
            return _Param(name, rest, (), quoted, source)  # case modification
        op = re.match(r":-|:=|:\+|:\?|-|=|\+|\?", rest)
        if not op:
            return _Opaque(
                source,
                f"{source} is not evaluated here (only ${{NAME}}, ${{NAME:-default}} and the "
                "like are)",
            )
        arg = _Lexer(rest[op.end() :], self.line).word(stop="").parts
        return _Param(name, op.group(), arg, quoted, source)


# ------------------------------------------------------------------------------ evaluation


class _ArithmeticError(Exception):
    pass


_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.LShift: lambda a, b: a << (b % 64),
    ast.RShift: lambda a, b: a >> (b % 64),
    ast.BitAnd: operator.and_,
    ast.BitOr: operator.or_,
    ast.BitXor: operator.xor,
}

_INTEGER_TESTS = {
    "-eq": operator.eq,
    "-ne": operator.ne,
    "-gt": operator.gt,
    "-ge": operator.ge,
    "-lt": operator.lt,
    "-le": operator.le,
}


def _integer_text(text: str) -> int | None:
    """``text`` as the integer ``[ A -gt B ]`` compares (``None``: not one)."""
    stripped = text.strip()
    return int(stripped) if re.fullmatch(r"[+-]?[0-9]+", stripped) else None


_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert}


def _int64(value: int) -> int:
    """``value`` wrapped to a signed 64-bit integer, as bash arithmetic does."""
    return (value + (1 << 63)) % (1 << 64) - (1 << 63)


@attrs.define
class _Frame:
    """One open ``if``/``case``/loop: ``state`` is on, off or unknown; ``taken`` says whether a
    branch of the ``if`` or ``case`` ran (``None``: cannot tell)."""

    state: str
    taken: bool | None
    case: _Case | None = None


@attrs.define
class _Case:
    """What an open ``case`` needs: the word it matches (``None``: unresolved, with why), and
    the patterns of the branch being read (a pattern list split by ``|`` arrives in pieces)."""

    subject: str | None
    why: str
    source: str
    line: int
    patterns: list[str] = attrs.field(factory=list)
    expecting: bool = True
    """Between branches: the next words are patterns."""
    falls_through: bool = False
    """The branch before ended in ``;&`` and ran: this one runs too."""
    variable: str = ""
    """The variable the word is (``DEVICE`` of ``"${DEVICE}"``), to name in the note."""


def _keyword(word: _RawWord) -> str | None:
    """The word's text when it is a plain unquoted word (a keyword or a command name)."""
    if len(word.parts) == 1 and isinstance(word.parts[0], _Lit) and not word.parts[0].quoted:
        return word.parts[0].text
    return None


def _assignment(word: _RawWord) -> tuple[str, bool, tuple[object, ...]] | None:
    """``NAME=value`` (or ``NAME+=value``): (name, appends, the value's parts)."""
    first = word.parts[0] if word.parts else None
    if not isinstance(first, _Lit) or first.quoted:
        return None
    match = _ASSIGNMENT.match(first.text)
    if not match:
        return None
    rest = first.text[match.end() :]
    value = ((_Lit(rest, False),) if rest else ()) + word.parts[1:]
    return match.group(1), bool(match.group(2)), value


def _shown(value: Unresolved, part: object) -> str:
    """How an expansion that does not resolve is shown in its word: as far as it expands
    (``$RAY_DATA_HOME/data``), or as written where that is only a command that is not run
    (``$REPO_ROOT`` for ``REPO_ROOT=$(cd ... && pwd)``: the name says more than the command)."""
    source: str = part.source  # type: ignore[attr-defined]
    shown = value.shown
    if not shown or (shown.startswith("$(") and shown.endswith(")") and _one_command(shown)):
        return source
    return shown


def _one_command(text: str) -> bool:
    """Whether ``text`` (``$(...)``) is one command substitution, not two side by side."""
    depth = 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and i < len(text) - 1 and i > 0:
            return False
    return True


class _Evaluator:
    def __init__(self, env: Mapping[str, str], inherited: Mapping[str, str]) -> None:
        self.variables: dict[str, Value] = {**inherited, **env}
        self.given = dict(env)
        """``--env`` values: they also stand for what the script would set by running
        something (``device_name=$(python ...)``), which cannot be known here."""
        self.inherited = {name: inherited[name] for name in inherited if name not in env}
        self.inherited_read: dict[str, str] = {}
        self.exported: list[str] = []
        self.commands: list[Command] = []
        self.notes: list[str] = []
        self.frames: list[_Frame] = []
        self.arrays: dict[str, tuple[tuple[Word, ...], bool] | Unresolved] = {}
        """Arrays: their words, and whether they hold the script's arguments (``$@``)."""
        self._passes_arguments = False

    # ---------------------------------------------------------------- commands

    def _state(self) -> str:
        states = {frame.state for frame in self.frames}
        return "off" if "off" in states else "unknown" if "unknown" in states else "on"

    def command(self, words: list[_RawWord], comment_lines: tuple[int, ...] = ()) -> None:
        case = self.frames[-1].case if self.frames else None
        if case is not None:
            if words[0].source == CASE_END:
                self._end_branch(_keyword(words[0]) or ";;")
                return
            if case.expecting and _keyword(words[0]) != "esac":
                words = self._patterns(case, words)
                if words is None:
                    return
        while words:
            keyword = _keyword(words[0])
            if keyword in ("then", "do", "{", "}"):
                words = words[1:]
            elif keyword == "if":
                self._open_if(words[1:])
                return
            elif keyword == "elif":
                self._elif(words[1:])
                return
            elif keyword == "else":
                self._else()
                words = words[1:]
            elif keyword in ("fi", "done", "esac"):
                if self.frames:
                    self.frames.pop()
                words = words[1:]
            elif keyword == "case":
                self._open_case(words)
                return
            elif keyword in ("for", "while", "until", "select"):
                self.frames.append(_Frame("off" if self._state() == "off" else "unknown", None))
                return
            else:
                break
        state = self._state()
        if words and state != "off":
            self._simple(words, state == "unknown", comment_lines)

    def _open_if(self, condition: list[_RawWord]) -> None:
        if self._state() == "off":
            self.frames.append(_Frame("off", True))
            return
        result = self._condition(condition)
        self._note_condition("if", condition, result)
        self.frames.append(_Frame(_branch(result), result))

    def _elif(self, condition: list[_RawWord]) -> None:
        if not self.frames:
            return
        frame = self.frames.pop()
        if self._state() == "off" or frame.taken:
            self.frames.append(_Frame("off", True))
        elif frame.taken is None:
            self.frames.append(_Frame("unknown", None))
        else:
            result = self._condition(condition)
            self._note_condition("elif", condition, result)
            self.frames.append(_Frame(_branch(result), result))

    def _note_condition(self, keyword: str, condition: list[_RawWord], result: bool | None) -> None:
        """A note naming the branch a decided condition takes (undecided ones are reported
        where their variables are used)."""
        if result is None or not condition:
            return
        written = _shorten(" ".join(word.source for word in condition).rstrip(" ;"))
        self.notes.append(
            f"line {condition[0].line}: {keyword} {written} is {'true' if result else 'false'}"
        )

    # ------------------------------------------------------------------ case

    def _open_case(self, words: list[_RawWord]) -> None:
        """``case WORD in``: the branches that follow are matched against WORD's value."""
        line = words[0].line
        subject_words = words[1:2]
        source = subject_words[0].source if subject_words else ""
        if self._state() == "off":
            self.frames.append(_Frame("off", True, _Case(None, "", source, line)))
            return
        expanded = [word for raw in subject_words for word in self._expand(raw)]
        params = [p for raw in subject_words for p in raw.parts if isinstance(p, _Param)]
        variable = (
            params[0].name if len(params) == 1 and re.fullmatch(_NAME, params[0].name) else ""
        )
        if len(expanded) == 1 and not expanded[0].unresolved:
            case = _Case(expanded[0].text, "", source, line)
        elif expanded and expanded[0].unresolved:
            case = _Case(None, "; ".join(expanded[0].unresolved), source, line)
        else:
            case = _Case("" if not expanded else None, "it is not one word", source, line)
        case.variable = variable
        self.frames.append(_Frame("off", False, case))

    def _patterns(self, case: _Case, words: list[_RawWord]) -> list[_RawWord] | None:
        """Read the patterns at the head of ``words`` (up to the word ending in ``)``); the
        words after them, the start of the branch's body, are returned (``None``: the pattern
        list goes on in the next command, after a ``|``)."""
        for index, raw in enumerate(words):
            last = raw.parts[-1] if raw.parts else None
            closes = isinstance(last, _Lit) and not last.quoted and last.text.endswith(")")
            parts = raw.parts
            if closes:
                assert isinstance(last, _Lit)
                trimmed = last.text[:-1]
                parts = (*parts[:-1], *((_Lit(trimmed, False),) if trimmed else ()))
            first = parts[0] if parts else None
            if isinstance(first, _Lit) and not first.quoted and first.text.startswith("("):
                parts = (_Lit(first.text[1:], False), *parts[1:])
            case.patterns.append(self._pattern(parts))
            if closes:
                self._open_branch(case, words[0].line)
                return words[index + 1 :]
        return None

    def _pattern(self, parts: tuple[object, ...]) -> str:
        """A pattern as an ``fnmatch`` pattern: quoted text matches itself; an unresolved
        expansion gives the pattern ``\0`` (it decides nothing, see :meth:`_open_branch`)."""
        pieces: list[str] = []
        for part in parts:
            if isinstance(part, _Lit):
                pieces.append(_glob_escape(part.text) if part.quoted else part.text)
                continue
            value = self._value((part,))
            if isinstance(value, Unresolved):
                return "\0"
            pieces.append(_glob_escape(value) if getattr(part, "quoted", False) else value)
        return "".join(pieces)

    def _open_branch(self, case: _Case, line: int) -> None:
        frame = self.frames[-1]
        patterns, case.patterns = case.patterns, []
        case.expecting = False
        shown = "|".join(patterns)
        parent_off = any(f.state == "off" for f in self.frames[:-1])
        if parent_off or frame.taken:
            frame.state = "off" if not case.falls_through else frame.state
            case.falls_through = False
            return
        if case.falls_through:
            case.falls_through = False
            return  # runs as the branch before did
        if frame.taken is None or case.subject is None or "\0" in patterns:
            frame.state, frame.taken = "unknown", None
            if case.subject is None:
                give = f"--env {case.variable}=VALUE" if case.variable else "--env NAME=VALUE"
                note = (
                    f"line {case.line}: case {case.source}: {case.why}; the branches' settings "
                    f"count as unresolved (give {give} to choose one)"
                )
                if note not in self.notes:
                    self.notes.append(note)
            return
        if any(fnmatch.fnmatchcase(case.subject, pattern) for pattern in patterns):
            frame.state, frame.taken = "on", True
            self.notes.append(
                f"line {case.line}: case {case.source} is {case.subject!r}: the branch {shown}) "
                f"of line {line} is taken"
            )
        else:
            frame.state = "off"

    def _end_branch(self, mark: str) -> None:
        frame = self.frames[-1]
        case = frame.case
        assert case is not None
        case.expecting = True
        if mark == ";&" and frame.state == "on":
            case.falls_through = True
            return
        if mark == ";;&" and frame.state != "off":
            frame.taken = None if frame.state == "unknown" else False
        frame.state = "off" if frame.taken is not None else "unknown"

    def _else(self) -> None:
        if self.frames:
            frame = self.frames[-1]
            frame.state = "off" if frame.taken else "unknown" if frame.taken is None else "on"
            frame.taken = True if frame.taken is not None else None

    def _condition(self, raw: list[_RawWord]) -> bool | None:
        words = [word for item in raw for word in self._expand(item)]
        negate = bool(words) and words[0].text == "!"
        words = words[1:] if negate else words
        if len(words) < 2 or any(word.unresolved for word in words):
            return None
        head, tail = words[0].text, words[-1].text
        if (head, tail) in (("[", "]"), ("[[", "]]")):
            args = [word.text for word in words[1:-1]]
        elif head == "test":
            args = [word.text for word in words[1:]]
        else:
            return None
        if len(args) == 3 and args[1] in ("=", "==", "!="):
            if head == "[[" and any(c in args[2] for c in "*?["):
                return None  # a pattern match
            result = (args[0] == args[2]) != (args[1] == "!=")
        elif len(args) == 3 and args[1] in _INTEGER_TESTS:
            numbers = [_integer_text(args[0]), _integer_text(args[2])]
            if None in numbers:
                return None  # bash stops with an error here; nothing is decided
            result = _INTEGER_TESTS[args[1]](numbers[0], numbers[1])
        elif len(args) == 2 and args[0] in ("-z", "-n"):
            result = (args[1] == "") == (args[0] == "-z")
        elif len(args) == 1:
            result = args[0] != ""
        else:
            return None
        return result != negate

    def _simple(
        self, words: list[_RawWord], conditional: bool, comment_lines: tuple[int, ...]
    ) -> None:
        line = words[0].line
        count = 0
        while count < len(words) and _assignment(words[count]):
            count += 1
        if count == len(words):
            for word in words:
                self._assign(*_assignment(word), conditional=conditional, line=line)  # type: ignore[misc]
            return
        name = _keyword(words[count])
        if name in ("export", "declare", "typeset", "local", "readonly"):
            self._declare(name, words[count + 1 :], conditional, line)
            return
        if name == "unset":
            for word in words[count + 1 :]:
                target = _keyword(word)
                if target and not target.startswith("-"):
                    self._set(target, None, conditional, line)
            return
        if name in ("source", "."):
            sourced = " ".join(word.source for word in words[count:])
            self.notes.append(
                f"line {line}: {sourced!r} is not read; the variables it sets count as unset"
            )
            return
        environment = tuple(
            (assigned[0], self._value(assigned[2]))
            for assigned in (_assignment(word) for word in words[:count])
            if assigned
        )
        self._passes_arguments = False
        expanded = tuple(word for raw in words[count:] for word in self._expand(raw))
        if not expanded:  # only assignments and expansions to nothing: bash keeps the variables
            for word in words[:count]:
                self._assign(*_assignment(word), conditional=conditional, line=line)  # type: ignore[misc]
            return
        self.commands.append(
            Command(
                expanded,
                line,
                environment,
                conditional,
                self._passes_arguments,
                comment_lines,
            )
        )

    def _declare(self, name: str, words: list[_RawWord], conditional: bool, line: int) -> None:
        exports = name == "export"
        for word in words:
            assigned = _assignment(word)
            text = _keyword(word)
            if assigned:
                self._assign(*assigned, conditional=conditional, line=line)
                target = assigned[0]
            elif text and text.startswith("-"):
                exports = exports or "x" in text
                continue
            elif text and re.fullmatch(_NAME, text):
                target = text
            else:
                continue
            if exports and target not in self.exported:
                self.exported.append(target)

    def _assign(
        self, name: str, appends: bool, parts: tuple[object, ...], *, conditional: bool, line: int
    ) -> None:
        if len(parts) == 1 and isinstance(parts[0], _Array):
            self._assign_array(name, appends, parts[0], conditional=conditional, line=line)
            return
        self.arrays.pop(name, None)
        value = self._value(parts)
        if appends:
            old = self.variables.get(name, "")
            if isinstance(old, Unresolved) or isinstance(value, Unresolved):
                value = old if isinstance(old, Unresolved) else value
            else:
                value = old + value
        self._set(name, value, conditional, line)

    def _assign_array(
        self, name: str, appends: bool, array: _Array, *, conditional: bool, line: int
    ) -> None:
        if conditional:
            self._set(name, "", conditional, line)
            self.arrays[name] = self.variables[name]  # type: ignore[assignment]
            return
        outer = self._passes_arguments
        self._passes_arguments = False
        words = tuple(word for raw in array.elements for word in self._expand(raw))
        passes = self._passes_arguments
        self._passes_arguments = outer
        old = self.arrays.get(name) if appends else None
        if isinstance(old, Unresolved):
            return
        if old is not None:
            words, passes = old[0] + words, old[1] or passes
        self.arrays[name] = (words, passes)
        # $NAME of an array is its first element
        first = words[0] if words else None
        self.variables[name] = (
            Unresolved("; ".join(first.unresolved), first.text)
            if first and first.unresolved
            else first.text
            if first
            else ""
        )

    def _array_words(self, ref: _ArrayRef) -> tuple[Word, ...] | Unresolved:
        """The words ``ref`` names: all the elements, or the one at its index."""
        found = self.arrays.get(ref.name)
        if found is None:
            value = self.variables.get(ref.name)
            if isinstance(value, Unresolved):
                return value
            if value is None:
                return Unresolved(f"${ref.name} is not set in the script")
            found = ((Word(value, ref.source, 0),), False)  # a plain variable: one element
        if isinstance(found, Unresolved):
            return found
        words, passes = found
        if ref.index in ("@", "*"):
            self._passes_arguments = self._passes_arguments or passes
            return words
        index = int(ref.index)
        return words[index : index + 1]

    def _set(self, name: str, value: Value | None, conditional: bool, line: int) -> None:
        if conditional:
            value = Unresolved(
                f"${name} is set in a loop or under a condition that cannot be decided here "
                f"(line {line})"
            )
        self.inherited.pop(name, None)  # the script's own value from here on
        if isinstance(value, Unresolved) and name in self.given and not conditional:
            note = (
                f"line {line}: ${name} is set by something not run here ({value.reason}); "
                f"the --env value {self.given[name]!r} stands for it"
            )
            if note not in self.notes:
                self.notes.append(note)
            value = self.given[name]
        if value is None:
            self.variables.pop(name, None)
            self.arrays.pop(name, None)
        else:
            self.variables[name] = value

    # -------------------------------------------------------------- expansion

    def _chunks(self, parts: tuple[object, ...]) -> list[tuple[str, bool, tuple[str, ...]]]:
        """(text, subject to word splitting, reasons it is unresolved) per part."""
        chunks: list[tuple[str, bool, tuple[str, ...]]] = []
        for part in parts:
            if isinstance(part, _Lit):
                chunks.append((part.text, False, ()))
            elif isinstance(part, _Opaque):
                chunks.append((part.source, False, (part.reason,)))
            elif isinstance(part, _ArrayRef):
                found = self._array_words(part)
                if isinstance(found, Unresolved):
                    chunks.append((part.source, False, (found.reason,)))
                    continue
                why = tuple(reason for word in found for reason in word.unresolved)
                text = " ".join(word.text for word in found)
                chunks.append((part.source if why else text, not part.quoted and not why, why))
            elif isinstance(part, _PathPart):
                value = self._value(part.word.parts)
                if isinstance(value, Unresolved):
                    chunks.append((part.source, False, (value.reason,)))
                else:
                    chunks.append((_path_command(part.command, value), not part.quoted, ()))
            elif isinstance(part, (_Param, _Arith)):
                value = self._param(part) if isinstance(part, _Param) else self._arith(part)
                if isinstance(value, Unresolved):
                    chunks.append((_shown(value, part), False, (value.reason,)))
                else:
                    chunks.append((value, not part.quoted, ()))
        return chunks

    def _value(self, parts: tuple[object, ...]) -> Value:
        """The parts as one string (an assignment's value: no word splitting)."""
        chunks = self._chunks(parts)
        reasons = list(dict.fromkeys(reason for chunk in chunks for reason in chunk[2]))
        if reasons:
            return Unresolved("; ".join(reasons), "".join(chunk[0] for chunk in chunks))
        return "".join(chunk[0] for chunk in chunks)

    def _expand(self, raw: _RawWord) -> list[Word]:
        """A word as the command sees it: expanded, unquoted, split where bash splits it
        (unquoted expansions), so it may give no word or several."""
        if _all_arguments(raw):
            self._passes_arguments = True
            return []
        whole = _whole_array(raw)
        if whole is not None:  # "${NAME[@]}": one word per element, as the array holds them
            found = self._array_words(whole)
            if isinstance(found, Unresolved):
                return [Word(whole.source, raw.source, raw.line, (found.reason,))]
            return list(found)
        words: list[Word] = []
        text: list[str] = []
        reasons: list[str] = []
        present = False

        def emit() -> None:
            nonlocal present
            if present:
                unique = tuple(dict.fromkeys(reasons))
                words.append(Word("".join(text), raw.source, raw.line, unique))
            text.clear()
            reasons.clear()
            present = False

        for chunk, splits, why in self._chunks(raw.parts):
            if not splits:
                text.append(chunk)
                reasons.extend(why)
                present = True
                continue
            for index, piece in enumerate(re.split(r"[ \t\n]+", chunk)):
                if index:
                    emit()
                if piece:
                    text.append(piece)
                    present = True
        emit()
        return words

    def _param(self, param: _Param) -> Value:
        name, op = param.name, param.op
        if name in ("@", "*"):
            self._passes_arguments = True
            return ""
        if name.isdigit() and name != "0" and op in (":-", "-", ":=", "="):
            # the script's arguments are not known here; launch scripts are mostly run
            # without them, so the default is what they run with
            default = self._value(param.arg)
            if not isinstance(default, Unresolved):
                note = (
                    f"{param.source} is read as its default, {default!r}, as when the script "
                    "is run without arguments"
                )
                if note not in self.notes:
                    self.notes.append(note)
            return default
        if not re.fullmatch(_NAME, name):
            return Unresolved(f"{param.source} depends on how the script is called")
        value = self._lookup(name)
        if isinstance(value, Unresolved):
            return value
        if op == "":
            return Unresolved(f"${name} is not set in the script") if value is None else value
        if op in (",,", "^^", ",", "^"):
            if value is None:
                return Unresolved(f"${name} is not set in the script")
            change = str.lower if op.startswith(",") else str.upper
            return change(value) if len(op) == 2 else change(value[:1]) + value[1:]
        unset_or_empty = value is None or (op.startswith(":") and value == "")
        if op in (":+", "+"):
            return "" if unset_or_empty else self._value(param.arg)
        if op in (":?", "?"):
            if unset_or_empty:
                return Unresolved(f"{param.source}: the script stops when ${name} is not set")
            return value  # type: ignore[return-value]
        if not unset_or_empty:
            return value  # type: ignore[return-value]
        default = self._value(param.arg)
        if op in (":=", "="):
            self.variables[name] = default
        return default

    def _lookup(self, name: str) -> Value | None:
        value = self.variables.get(name)
        if name in self.inherited and value == self.inherited[name]:
            self.inherited_read.setdefault(name, value)
        return value

    def _arith(self, arith: _Arith) -> Value:
        expression = self._value(arith.parts)
        if isinstance(expression, Unresolved):
            return expression
        try:
            return str(self._evaluate(expression, depth=0))
        except _ArithmeticError as exc:
            return Unresolved(f"{arith.source}: {exc}")

    def _evaluate(self, expression: str, depth: int) -> int:
        try:
            tree = ast.parse(expression.strip() or "0", mode="eval")
        except SyntaxError:
            raise _ArithmeticError(
                f"{expression.strip()!r} is not integer arithmetic evaluated here"
            ) from None
        return self._node(tree.body, depth)

    def _node(self, node: ast.AST, depth: int) -> int:
        """An integer as bash computes it: 64-bit, division truncating toward zero."""
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return _int64(node.value)
        if isinstance(node, ast.Name):
            return self._integer(node.id, depth)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _int64(_UNARY[type(node.op)](self._node(node.operand, depth)))
        if isinstance(node, ast.BinOp):
            left, right = self._node(node.left, depth), self._node(node.right, depth)
            if type(node.op) in _BINARY:
                return _int64(_BINARY[type(node.op)](left, right))
            if isinstance(node.op, (ast.Div, ast.Mod)):
                if right == 0:
                    raise _ArithmeticError("division by zero")
                quotient = abs(left) // abs(right) * (1 if (left < 0) == (right < 0) else -1)
                return _int64(quotient if isinstance(node.op, ast.Div) else left - right * quotient)
            if isinstance(node.op, ast.Pow) and right >= 0:
                return _int64(pow(left, right, 1 << 64))
        raise _ArithmeticError(f"{ast.unparse(node)!r} is not integer arithmetic evaluated here")

    def _integer(self, name: str, depth: int) -> int:
        value = self._lookup(name)
        if value is None:
            raise _ArithmeticError(f"${name} is not set in the script")
        if isinstance(value, Unresolved):
            raise _ArithmeticError(value.reason)
        text = value.strip()
        if re.fullmatch(r"[+-]?[0-9]+", text):
            return int(text)
        if depth > 8 or not text:
            raise _ArithmeticError(f"${name} is {value!r}, not an integer")
        return self._evaluate(text, depth + 1)


def _all_arguments(word: _RawWord) -> bool:
    """The word is ``$@`` (or ``"$@"``, ``${@}``, ``$*``): the script's arguments, none here."""
    params = [p for p in word.parts if isinstance(p, _Param)]
    others = [p for p in word.parts if not isinstance(p, _Param)]
    return (
        len(params) == 1
        and params[0].name in ("@", "*")
        and all(isinstance(p, _Lit) and not p.text for p in others)
    )


def _whole_array(word: _RawWord) -> _ArrayRef | None:
    """The ``${NAME[@]}`` (quoted or not) that is the whole word, if it is."""
    refs = [p for p in word.parts if isinstance(p, _ArrayRef)]
    others = [p for p in word.parts if not isinstance(p, _ArrayRef)]
    if (
        len(refs) == 1
        and refs[0].index == "@"
        and all(isinstance(p, _Lit) and not p.text for p in others)
    ):
        return refs[0]
    return None


def _path_command(command: str, path: str) -> str:
    """What ``basename PATH`` or ``dirname PATH`` prints (without its newline)."""
    trimmed = path.rstrip("/") or ("/" if path.startswith("/") else "")
    if command == "basename":
        return trimmed.rsplit("/", 1)[-1] if trimmed != "/" else "/"
    if "/" not in trimmed:
        return "."
    head = trimmed.rsplit("/", 1)[0].rstrip("/")
    return head or "/"


def _glob_escape(text: str) -> str:
    """``text`` as an ``fnmatch`` pattern that matches only itself."""
    return re.sub(r"([*?\[])", r"[\1]", text)


def _branch(result: bool | None) -> str:
    return "unknown" if result is None else "on" if result else "off"
