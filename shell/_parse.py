"""Reading a command line: words, quoting, ``;`` between commands, ``>``/``>>`` redirection.

The grammar is a small, predictable subset of the POSIX shell's, because the shell has
no processes to connect: there are no pipes, no ``&``, no variables, no command
substitution. Anything that would mean one of those in ``sh`` is a syntax error here
rather than a literal character, so a line written for ``sh`` never silently does
something else.

* words are separated by blanks; ``'...'`` keeps everything literally, ``"..."`` too but
  for ``\\`` before ``$``, a backtick, ``"``, ``\\`` or a newline, which it escapes (as
  in sh: before anything else it stays); outside quotes ``\\`` escapes the next character;
* a quote may span lines, and ``\\`` before a newline (outside single quotes) joins the
  line to the next, as in sh: :func:`continues_on_next_line` tells a reader of lines
  that one is not finished, so that it reads the next before running anything;
* ``;`` (or a newline) ends a command; ``# ...`` at the start of a word is a comment;
* ``> FILE`` and ``>> FILE`` send the command's output to a file on the chip;
* ``*``, ``?`` and ``[...]`` in an unquoted word are glob patterns (expanded against
  the chip's files by the caller: :attr:`Word.glob`);
* ``$NAME``, ``${...}`` and ``2>`` are syntax errors, and so are ``$(...)`` and backticks,
  in double quotes too (a literal ``$`` is quoted ``'$'`` or ``\\$``, or stands before a
  blank or a character sh would not expand).

The same parser runs on both sides: tile 0 executes the commands, and the terminal
front-end uses it to find the commands it carries out itself (``put``, ``get``...),
using :attr:`Command.text` to send the rest on unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ShellSyntaxError", "Word", "Command", "continues_on_next_line", "parse_line", "quote"]

_GLOB_CHARS = frozenset("*?[")
#: what ``\`` escapes inside double quotes (before anything else it is itself, as in sh)
_ESCAPED_IN_DOUBLE_QUOTES = frozenset('$`"\\\n')
_UNSUPPORTED = {  # (longest first where one starts another)
    "||": "|| and && are not supported (use ; to run commands in turn)",
    "&&": "|| and && are not supported (use ; to run commands in turn)",
    "|": "pipes are not supported",
    "&": "background jobs are not supported",
    "<": "input redirection is not supported",
    "`": "command substitution is not supported",
    "$(": "command substitution is not supported",
}


class ShellSyntaxError(ValueError):
    """A line that does not parse; the message is for the user."""


@dataclass
class Word:
    text: str
    #: the word as an ``fnmatch`` pattern if unquoted glob characters appear in it (quoted
    #: ones are escaped), else None: the caller expands it against the files
    pattern: str | None = None
    #: it starts with an unquoted ``~``, which sh expands to a home directory (a host
    #: path's: the chip has no home directories)
    tilde: bool = False


@dataclass
class Command:
    words: list[Word]
    #: ``(file, append)`` for ``> file`` / ``>> file``
    redirect: tuple[Word, bool] | None = None
    #: the command as written in the line (for the front-end to pass on)
    text: str = ""

    @property
    def argv(self) -> list[str]:
        return [word.text for word in self.words]

    @property
    def name(self) -> str:
        return self.words[0].text if self.words else ""


def parse_line(line: str) -> list[Command]:
    """The commands of ``line`` in order (empty lines are dropped; an empty command
    before ``;``, as in ``a;;b`` or ``; b``, is a syntax error, as in ``sh``)."""
    commands: list[Command] = []
    words: list[Word] = []
    redirect: tuple[Word, bool] | None = None
    pending_redirect: bool | None = None  # append flag while waiting for the file word
    start = 0
    pos = 0
    n = len(line)

    def finish(end: int) -> None:
        nonlocal words, redirect
        if pending_redirect is not None:
            raise ShellSyntaxError("syntax error: '>' needs a file name after it")
        if words:
            commands.append(Command(words, redirect, line[start:end].strip()))
        elif redirect is not None:
            raise ShellSyntaxError("syntax error: a redirection needs a command")
        words, redirect = [], None

    while pos < n:
        char = line[pos]
        if char in " \t\r":
            pos += 1
            continue
        if line.startswith("\\\n", pos):  # a line joined to the next, between words
            pos += 2
            continue
        if char in ";\n":
            if char == ";" and not words and redirect is None and pending_redirect is None:
                token = ";;" if line.startswith(";;", pos) or line[pos - 1 : pos] == ";" else ";"
                raise ShellSyntaxError(f"syntax error near {token!r}: no command before it")
            finish(pos)
            pos += 1
            start = pos
            continue
        if char == "#":
            end = line.find("\n", pos)
            pos = n if end < 0 else end
            continue
        if char == ">":
            if pending_redirect is not None:
                raise ShellSyntaxError("syntax error near '>'")
            if redirect is not None:
                raise ShellSyntaxError("syntax error: only one redirection per command")
            append = line.startswith(">>", pos)
            pending_redirect = append
            pos += 2 if append else 1
            continue
        for token, why in _UNSUPPORTED.items():
            if line.startswith(token, pos):
                raise ShellSyntaxError(f"syntax error near {token!r}: {why}")
        word_start = pos
        word, pos = _read_word(line, pos)
        if line.startswith(">", pos) and line[word_start:pos].isdigit():
            raise ShellSyntaxError(f"syntax error near {line[word_start:pos + 1]!r}: redirecting a "
                                   "numbered stream is not supported (> sends the output)")
        if pending_redirect is not None:
            redirect = (word, pending_redirect)
            pending_redirect = None
        else:
            words.append(word)
    finish(n)
    return commands


def _read_word(line: str, pos: int) -> tuple[Word, int]:
    parts: list[str] = []
    pattern: list[str] = []  # the same characters, quoted ones escaped for fnmatch
    glob = False
    tilde = line.startswith("~", pos)  # (unquoted: a quoted one starts with the quote)
    n = len(line)

    # inside an unquoted [...] (None outside): where its [ is in ``pattern``, the members
    # seen so far, each pattern piece since as it would be outside a bracket (an unclosed
    # [ is a literal, in sh as in fnmatch: the word's end rebuilds it so), and the quoted
    # characters fnmatch would read as syntax there (a ! first, a ] not first, a - between
    # members) with their member index, refused only if the bracket closes
    bracket: _Bracket | None = None

    def literal(text: str) -> None:
        parts.append(text)
        if bracket is None:
            pattern.append(_escaped(text))
            return
        for c in text:  # (a member: * ? [ are themselves inside brackets)
            if c == "!" and not bracket.members and pattern[-1] == "[" or c in "]-" and bracket.members:
                bracket.doubtful.append((c, bracket.members))
            pattern.append(c)
            bracket.outside.append(_escaped(c))
            bracket.members += 1

    def no_variable(at: int) -> None:
        # $NAME, ${...} and $1 would be expanded by sh (unquoted or in "..."): refuse them
        following = line[at + 1 : at + 2]
        if following and (following.isalnum() or following in "_{?#@*!$-"):
            name = line[at : at + 2] if not following.isalnum() else line[at:].split()[0].split('"')[0]
            raise ShellSyntaxError(f"syntax error near {name!r}: variables are not supported "
                                   "(quote a literal $ as '$')")

    while pos < n:
        char = line[pos]
        if char in " \t\r\n;>":
            break
        if char in "|&<`" or line.startswith("$(", pos):
            break
        if char == "'":
            end = line.find("'", pos + 1)
            if end < 0:
                raise ShellSyntaxError("syntax error: unterminated ' quote")
            literal(line[pos + 1 : end])
            pos = end + 1
        elif char == '"':
            pos += 1
            while True:
                if pos >= n:
                    raise ShellSyntaxError('syntax error: unterminated " quote')
                char = line[pos]
                if char == '"':
                    pos += 1
                    break
                if char == "\\" and pos + 1 < n and line[pos + 1] in _ESCAPED_IN_DOUBLE_QUOTES:
                    if line[pos + 1] != "\n":  # (a line joined to the next, as in sh)
                        literal(line[pos + 1])
                    pos += 2
                else:
                    if char == "`" or line.startswith("$(", pos):  # sh substitutes in "..." too
                        token = line[pos : pos + 2] if char == "$" else char
                        raise ShellSyntaxError(f"syntax error near {token!r}: command substitution is "
                                               "not supported")
                    if char == "$":
                        no_variable(pos)
                    literal(char)
                    pos += 1
        elif char == "\\":
            if pos + 1 >= n:
                raise ShellSyntaxError("syntax error: '\\' at the end of the line")
            if line[pos + 1] != "\n":  # (a line joined to the next, as in sh: nothing of it stays)
                literal(line[pos + 1])
            pos += 2
        else:
            if char in _GLOB_CHARS:
                glob = True
            elif char == "$":
                no_variable(pos)
            parts.append(char)
            negation = char in "!^" and bracket is not None and not bracket.members and pattern[-1] == "["
            # bash's [^..] is fnmatch's [!..] (a quoted ^ stays a ^: fnmatch takes it so)
            pattern.append("!" if negation else char)
            if bracket is None:
                bracket = _Bracket(len(pattern) - 1) if char == "[" else None
            elif char == "]" and bracket.members:
                for quoted, member in bracket.doubtful:  # (a - last is itself)
                    if quoted != "-" or member < bracket.members - 1:
                        raise ShellSyntaxError(_UNSUPPORTED_IN_BRACKETS.format(quoted))
                bracket = None
            else:
                bracket.outside.append(char)
                bracket.members += not negation
            pos += 1
    if bracket is not None:  # never closed: its [ and what followed it, as outside brackets
        pattern[bracket.opened_at:] = ["[[]", *bracket.outside]
    return Word("".join(parts), "".join(pattern) if glob else None, tilde), pos


def _escaped(text: str) -> str:
    """Quoted text as an fnmatch pattern outside brackets: its * ? [ match themselves."""
    return "".join(f"[{c}]" if c in _GLOB_CHARS else c for c in text)


@dataclass
class _Bracket:
    """An unquoted ``[`` being read (see _read_word)."""

    opened_at: int
    members: int = 0
    outside: list[str] = field(default_factory=list)
    doubtful: list[tuple[str, int]] = field(default_factory=list)


#: a quoted character inside a glob's [...] that fnmatch would read as syntax there
_UNSUPPORTED_IN_BRACKETS = (
    "syntax error: a quoted {0!r} inside a glob's [...] is not supported; write it unquoted where "
    "it stands for itself there (! after the first character, ] first, - first or last)")


def continues_on_next_line(text: str) -> bool:
    """Whether ``text`` ends inside a quote or with a ``\\`` escaping its end: the
    command goes on in the next line, as sh reads it, and nothing of it may run before
    that line is read (a line inside quotes is not a command: it may say ``rm -r``).

    Only quotes, ``\\`` and comments are read here, so that a syntax error earlier in
    the text (``$X "...``) still joins the quoted lines: the whole is then refused, and
    no line from inside its quotes runs on its own."""
    pos = 0
    n = len(text)
    word_start = True  # (a # starts a comment only there, as in parse_line)
    while pos < n:
        char = text[pos]
        if char == "\\":
            if pos + 1 >= n:
                return True
            pos += 2
            if text[pos - 1] == "\n":
                continue  # (joined lines: a word may still start after it)
        elif char == "'":
            end = text.find("'", pos + 1)
            if end < 0:
                return True
            pos = end + 1
        elif char == '"':
            pos += 1
            while pos < n and text[pos] != '"':
                # (skipping the character after any \ is right for finding the end: it
                # skips an escaped " or \, and anything else is not the end either)
                pos += 2 if text[pos] == "\\" else 1
            if pos >= n:
                return True
            pos += 1
        elif char == "#" and word_start:
            end = text.find("\n", pos)
            if end < 0:
                return False
            pos = end
        else:
            word_start = char in " \t\r\n;<>|&"  # (where _read_word ends a word)
            pos += 1
            continue
        word_start = False
    return False


def quote(text: str) -> str:
    """``text`` as one word of a command line (for completions and messages)."""
    if text and all(c.isalnum() or c in "-_./,:+=@%" for c in text):
        return text
    return "'" + text.replace("'", "'\\''") + "'"
