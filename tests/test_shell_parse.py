"""The shell's line grammar, block detection and completion of words: pure functions."""

from __future__ import annotations

import re

import pytest

from ipuos.shell import COMMANDS, ShellSyntaxError, block_complete, parse_line, quote
from ipuos.shell._complete import _current_word, complete_host_path, host_word
from ipuos.shell._parse import continues_on_next_line


def argvs(line):
    return [command.argv for command in parse_line(line)]


def test_words_and_semicolons():
    assert argvs("mkdir /d; ls /") == [["mkdir", "/d"], ["ls", "/"]]
    assert argvs("  ls   -l  ") == [["ls", "-l"]]
    assert argvs("a\nb") == [["a"], ["b"]]
    assert argvs("a;\n\nb;") == [["a"], ["b"]]  # (empty lines, and a ; ending a command, as in sh)


@pytest.mark.parametrize("line, token", [("echo a;;echo b", ";;"), ("echo a; ; echo b", ";"), (";", ";"),
                                         ("; echo b", ";"), ("echo a\n;echo b", ";"), (";;", ";;")])
def test_a_semicolon_with_no_command_before_it_is_a_syntax_error_as_in_sh(line, token):
    """(``a;;b`` ran both commands: sh refuses the line, so nothing of it runs)"""
    with pytest.raises(ShellSyntaxError, match=f"^syntax error near '{token}': no command before it$"):
        parse_line(line)


def test_quoting_keeps_blanks_and_specials():
    assert argvs("echo 'a b;c' \"d > e\" f\\ g") == [["echo", "a b;c", "d > e", "f g"]]
    assert argvs('echo "say \\"hi\\"" \'it\'\'s\'') == [["echo", 'say "hi"', "its"]]
    assert argvs("echo a\\;b") == [["echo", "a;b"]]


def test_a_backslash_in_double_quotes_escapes_what_sh_has_it_escape():
    # $ ` " \ and a newline (which it removes); before anything else it stays, as in sh
    assert argvs(r'echo "\$" "a\`b" "\$HOME" "q\"q" "x\\y" "\a" "\*"') == [
        ["echo", "$", "a`b", "$HOME", 'q"q', "x\\y", "\\a", "\\*"]]
    assert argvs('echo "a\\\nb"') == [["echo", "ab"]]
    (command,) = parse_line(r'ls "\*"*')
    assert command.words[1].pattern == "\\[*]*"  # (the quoted star matches itself only)


def test_a_backslash_before_a_newline_joins_the_lines_as_in_sh():
    # (it was kept as a newline in the word; outside any word it made an empty one)
    assert argvs("echo a \\\nb c\\\nd \\\n  e") == [["echo", "a", "b", "cd", "e"]]
    assert argvs("echo 'a\\\nb'") == [["echo", "a\\\nb"]]  # (in single quotes it stays)
    assert argvs('echo "a\nb"') == [["echo", "a\nb"]]


@pytest.mark.parametrize("text, continues", [
    ('echo "a', True), ("echo 'a", True), ("echo a \\", True), ('echo "a\\"', True),
    ("echo 'a\\", True), ('echo $X "a', True), ('echo a#"b', True), ('echo a)#"b', True),
    ('echo "a\nb"', False), ("echo 'a\nb'", False), ("echo a \\\nb", False), ('echo "a\\\\"', False),
    ("echo it\\'s", False), ("echo # it's", False), ("ls\n# don't", False), ("", False),
])
def test_a_line_continues_on_the_next_inside_a_quote_or_after_a_backslash(text, continues):
    assert continues_on_next_line(text) is continues


def test_command_text_is_kept_for_the_front_end():
    commands = parse_line("put a.txt /chip ; ls -l /chip")
    assert [c.text for c in commands] == ["put a.txt /chip", "ls -l /chip"]


def test_redirection():
    (command,) = parse_line("echo hi >> /log")
    assert command.argv == ["echo", "hi"]
    assert command.redirect[0].text == "/log" and command.redirect[1] is True
    (command,) = parse_line("echo hi>/f")
    assert command.argv == ["echo", "hi"] and command.redirect[0].text == "/f"
    assert command.redirect[1] is False


def test_comments():
    assert argvs("ls / # list the root") == [["ls", "/"]]
    assert argvs("echo a#b") == [["echo", "a#b"]]


def test_globs_are_marked_unless_quoted():
    (command,) = parse_line("rm *.txt 'x*' \"y?\" plain")
    patterns = [word.pattern for word in command.words]
    assert patterns == [None, "*.txt", None, None, None]
    (command,) = parse_line("ls 'a*'b*")
    assert command.words[1].text == "a*b*"
    assert command.words[1].pattern == "a[*]b*"  # the quoted star matches itself only


@pytest.mark.parametrize("word, pattern", [
    ("[a!]*", "[a!]*"), ("[^a]*", "[!a]*"), ("[\\^a]*", "[^a]*"), ("[\\*a]", "[*a]"), ('["]"a]', "[]a]"),
    ("[az\\-]", "[az-]"), ("[!\\!]", "[!!]"), ("[['!']", "[[!]"),
    # a quoted - that was fine in one bracket is not held against the next
    ("log[_'-']*[0-9]", "log[_-]*[0-9]"),
    # an unclosed [ is itself, and the quoted characters after it stay themselves
    ("x[1'*'", "x[[]1[*]"), ("[\\!a", "[[]!a"),
])
def test_quoted_characters_in_glob_brackets_are_members(word, pattern):
    (command,) = parse_line(f"ls {word}")
    assert command.words[1].pattern == pattern


@pytest.mark.parametrize("line, message", [
    ("ls | wc", "pipes are not supported"),
    ("echo a || echo b", "syntax error near '||': || and && are not supported (use ; to run commands in turn)"),
    ("echo a && echo b", "syntax error near '&&': || and && are not supported"),
    ("sleep 1 &", "background jobs are not supported"),
    ("cat < f", "input redirection"),
    ("echo `id`", "command substitution"),
    ("echo $(id)", "command substitution"),
    ("echo 'open", "unterminated ' quote"),
    ('echo "open', 'unterminated " quote'),
    ("echo >", "needs a file name"),
    ("> f", "needs a command"),
    ("echo a > f > g", "only one redirection"),
    ("echo a 2> f", "redirecting a numbered stream is not supported"),
    ("echo $HOME", "variables are not supported"),
    ('echo "at $HOME"', "variables are not supported"),
    ("echo ${x}", "variables are not supported"),
    ('echo "a`id`"', "command substitution"),
    ('echo "$(id)"', "command substitution"),
])
def test_what_sh_would_read_differently_is_an_error(line, message):
    with pytest.raises(ShellSyntaxError, match=re.escape(message)):
        parse_line(line)


def test_a_dollar_sh_would_not_expand_is_literal():
    assert argvs("echo '$HOME' costs $ 5 a$ \\$x") == [["echo", "$HOME", "costs", "$", "5", "a$", "$x"]]


def test_quote_round_trips():
    for text in ["plain", "a b", "it's", "semi;colon", "", "*"]:
        assert argvs(f"echo {quote(text)}") == [["echo", text]]


def test_block_complete_follows_the_interactive_interpreter():
    assert block_complete("x = 1")
    assert not block_complete("for i in range(3):")
    assert not block_complete("for i in range(3):\n    print(i)")
    assert block_complete("for i in range(3):\n    print(i)\n")
    assert not block_complete("f(1,")
    assert block_complete("f(1,\n  2)")
    assert block_complete("x = = 1")  # broken beyond repair: the tiles report it


@pytest.mark.parametrize("lines, inside", [
    (["def f():", "    x = 1"], True), (["@cache", "def f():"], False), (["@cache", "def f():", "    x"], True),
    (["@cache", "    pass"], False),  # (an error: said at once)
    (["for i in x:", "    y = [", "    1]"], True),
    (["x = [", "    1]"], False),  # (a bracket closed on an indented line ends the block)
    (["if x: y = 1", "    z"], False),  # (one line: the next is an error, said at once)
    (["def f():", ""], False), (["def f():", "print(1)"], False), (["def f():"], False),
])
def test_a_read_blocks_indented_body_is_not_compiled_line_by_line(lines, inside):
    # each line of a 2,000-line block read from a pipe recompiled all before it: a minute
    from ipuos.shell._blocks import inside_compound_statement

    assert inside_compound_statement(lines) is inside
    if inside:  # (what it saves: the block is not complete there)
        assert not block_complete("\n".join(lines))


def test_current_word_for_completion():
    assert _current_word("mk") == (0, "mk", "")
    assert _current_word("ls /ch") == (3, "/ch", "ls ")
    assert _current_word("mkdir x; ls /a\\ b") == (12, "/a b", " ls ")
    assert _current_word("echo hi > /tm") == (10, "/tm", "echo hi > ")


def test_the_command_table_covers_the_shell():
    expected = {"help", "ls", "cd", "pwd", "cat", "head", "tail", "echo", "touch", "mkdir", "rm",
                "rmdir", "mv", "cp", "tree", "stat", "df", "du", "free", "mount", "umount", "ps",
                "kill", "run", "python", "multirepl", "history", "clear", "exit", "put", "get"}
    assert set(COMMANDS) == expected
    terminal = {name for name, spec in COMMANDS.items() if spec.terminal}
    assert terminal == {"put", "get", "history", "clear", "exit"}
    assert all(spec.summary and spec.usage.startswith(name) for name, spec in COMMANDS.items())


def test_host_paths_of_put_and_get_are_completed_on_the_host():
    assert host_word("put ~/da") == (4, "~/da")
    assert host_word("get /chip/x ho") == (12, "ho")
    assert host_word("get /ch") is None and host_word("put a /ch") is None and host_word("ls a") is None
    # after --, after a chip path quoted or escaped with a space in it, and multirepl --data
    # (none of these completed)
    assert host_word("put -- ~/da") == (7, "~/da")
    assert host_word("get -- /chip/x ho") == (15, "ho")
    assert host_word('get "/chip/my file" ho') == (20, "ho")
    assert host_word("get /chip/my\\ file ho") == (19, "ho")
    assert host_word("multirepl --tiles 0-3 --data ~/wo") == (29, "~/wo")
    assert host_word("multirepl --data=~/wo") == (17, "~/wo")
    assert host_word("multirepl --tiles 0-3 --dat") is None and host_word("get 'unclosed ho") is None
    listing = {"dir/": [("data.txt", False), ("deep", True), (".dot", False)]}
    assert complete_host_path("dir/d", lambda d: listing[d]) == ["dir/data.txt ", "dir/deep/"]


# -- Python names (python and multirepl mode) ----------------------------------------------------


def test_python_completion_of_names_attributes_builtins_and_keywords():
    import math

    from ipuos.shell._complete import complete_python

    namespace = {"math": math, "total": 3, "_hidden": 1, "__builtins__": {"print": print, "len": len}}
    assert complete_python(namespace, "x = tot") == (4, ["total"])
    assert complete_python(namespace, "pri") == (0, ["print"])  # the tile's builtins
    assert complete_python(namespace, "whi") == (0, ["while"])
    assert complete_python(namespace, "math.fl") == (0, ["math.floor"])
    assert complete_python(namespace, "_h") == (0, ["_hidden"])  # "_" names only if typed
    assert "_hidden" not in complete_python(namespace, "")[1]
    for nothing in ("", "1.", "x.", "missing.at", "(total) "):
        assert complete_python(namespace, nothing)[1] == [], nothing


def test_python_completion_runs_none_of_the_users_code():
    from ipuos.shell._complete import complete_python

    ran = []

    class Lazy:
        @property
        def heavy(self):
            ran.append("heavy")
            return 42

        def __getattr__(self, name):
            ran.append(name)
            raise AttributeError(name)

    namespace = {"thing": Lazy()}
    assert complete_python(namespace, "thing.hea") == (0, ["thing.heavy"])
    assert complete_python(namespace, "thing.heavy.bit") == (0, [])  # (its value is unknown)
    assert complete_python(namespace, "thing.other.x") == (0, [])
    assert ran == []


@pytest.mark.parametrize("word, pattern", [
    ("[^a]*", "[!a]*"),  # bash's negation, in fnmatch's spelling
    ("[!a]*", "[!a]*"),
    ("[\\^a]*", "[^a]*"),  # a quoted ^ is a ^ (fnmatch takes "[^" literally)
    ("['^'a]*", "[^a]*"),
    ("x^[a]", "x^[a]"),  # a ^ elsewhere is a ^
])
def test_a_caret_negates_a_bracket_only_unquoted(word, pattern):
    (command,) = parse_line(f"echo {word}")
    assert command.words[1].pattern == pattern


@pytest.mark.parametrize("args, letters, long, expected", [
    (["-l", "x", "-a"], "la", (), ({"-l": "", "-a": ""}, ["x"])),  # options after operands
    (["-la", "-n5", "-"], "lan:", (), ({"-l": "", "-a": "", "-n": "5"}, ["-"])),
    (["-ln", "5", "--", "-a"], "lan:", (), ({"-l": "", "-n": "5"}, ["-a"])),
    (["--tiles", "0-3", "--data=a=b", "rest"], "", ("tiles=", "data="),
     ({"--tiles": "0-3", "--data": "a=b"}, ["rest"])),
    (["-c", "--not-an-option"], "c:", (), ({"-c": "--not-an-option"}, [])),
])
def test_options_are_read_as_getopt_reads_them(args, letters, long, expected):
    from ipuos.shell._table import options

    assert options(args, letters, long) == expected


@pytest.mark.parametrize("args, letters, long, message", [
    (["--dat", "f"], "", ("tiles=", "data="), "option --dat not recognized (did you mean --data?)"),
    (["--t", "0"], "", ("tile=", "tiles="), "option --t not recognized"),  # (either)
    (["--tilse", "0"], "", ("tiles=", "data="), "option --tilse not recognized (did you mean --tiles?)"),
    (["--tile", "0"], "", ("tiles=", "data="), "option --tile not recognized (did you mean --tiles?)"),
    (["-z"], "la", (), "option -z not recognized"),
    (["-n"], "n:", (), "option -n requires argument"),
    (["--tiles"], "", ("tiles=",), "option --tiles requires argument"),
    (["--p="], "", ("p",), "option --p must not have an argument"),
])
def test_options_refuse_abbreviations_and_mistakes(args, letters, long, message):
    from ipuos.shell._table import Usage, options

    with pytest.raises(Usage) as raised:
        options(args, letters, long)
    assert str(raised.value) == message


@pytest.mark.parametrize("name, meant", [
    ("--til", ["--tiles"]), ("--tile", ["--tiles"]), ("--tilse", ["--tiles"]), ("--tiels", ["--tiles"]),
    ("--tiless", ["--tiles"]), ("--tiler", ["--tiles"]), ("--dat", ["--data"]), ("--date", ["--data"]),
    ("--time", []), ("--tiles-x", []), ("--", []), ("-t", []), ("--x", []), ("--d", ["--data"]),
    ("--da", ["--data"]),
])
def test_what_a_mistyped_long_option_was_meant_to_be(name, meant):
    from ipuos._spelling import meant_options

    assert meant_options(name, ["--tiles", "--data", "-d"]) == meant
