"""The shell's kernel services on tile 0 of an in-process machine: sessions, completion,
interrupts of commands that are not jobs, streaming. (The daemon and the terminal around
them are tested in test_shell and test_shell_pty.)"""

from __future__ import annotations

import threading
import time

import pytest

import ipuos
from ipuos._cmd_shell import _DaemonShellHost
from ipuos.shell import EXIT_INTERRUPTED, ShellServer


class _Host:
    """The little of the daemon's MachineHost that the shell host uses."""

    def __init__(self, machine):
        self.machine = machine
        self.name = "in-process"
        self.halt_requested = threading.Event()
        self._jobs = {}

    def add_job(self, job):
        self._jobs[job.id] = job

    def remove_job(self, job_id, thaw=False):
        self._jobs.pop(job_id, None)

    def jobs(self):
        return list(self._jobs.values())


@pytest.fixture(scope="module")
def server():
    with ipuos.Machine("tiny") as machine:
        server = ShellServer(machine.scheduler, machine.storage, _DaemonShellHost(_Host(machine)))
        server.install()
        yield server


def call(server, service, *args):
    return server.scheduler.submit(0, service, *args).result(30)


class Session:
    def __init__(self, server):
        self.server = server
        self.id = call(server, "shell.open", None, 0)["session"]
        self.seq = 0
        self.streamed = []

    def run(self, line, emit=None, width=0, echoes_ctrl_c=False):
        self.seq += 1
        result = call(self.server, "shell.exec", self.id, self.seq, line, b"", False, width,
                      emit or self.streamed.extend, echoes_ctrl_c)
        result["text"] = "".join(text for _, text in self.streamed + result["output"])
        self.streamed = []
        return result

    def complete(self, text):
        return call(self.server, "shell.complete", self.id, text)


def test_sessions_have_their_own_directory(server):
    one, two = Session(server), Session(server)
    one.run("mkdir -p /s1 /s2")
    assert one.run("cd /s1")["cwd"] == "/s1"
    assert two.run("cd /s2")["prompt"] == "ipuos:/s2$ "
    assert one.run("pwd")["text"] == "/s1\n"
    assert one.run("touch here; ls /s1; ls /s2")["text"] == "here\n"


@pytest.mark.parametrize("echoes_ctrl_c", [False, True])
def test_ctrl_c_stops_a_long_command_between_steps(server, echoes_ctrl_c):
    session = Session(server)
    for index in range(6):  # ~96 KB on the chip disk: several flushes of output
        session.run(f"python -c \"open('/chip/big{index}', 'w').write('x' * 16000 + '\\\\n')\"")
    pieces = []

    def emit(batch):  # the first batch of output reaches the terminal: the user presses Ctrl-C
        pieces.extend(batch)
        server.interrupt(session.id, session.seq)

    result = session.run("cat /chip/big0 /chip/big1 /chip/big2 /chip/big3 /chip/big4 /chip/big5; "
                         "echo not-reached", emit=emit, echoes_ctrl_c=echoes_ctrl_c)
    assert result["status"] == EXIT_INTERRUPTED
    if echoes_ctrl_c:  # (the terminal showed the user's ^C: said once is enough)
        assert "^C" not in result["text"]
        assert result["output"][-1] == ["err", "cat: interrupted\n"]
    else:
        assert result["output"][-1] == ["err", "^C\ncat: interrupted\n"]
    printed = sum(len(text) for _, text in pieces + result["output"] if _ == "out")
    assert 32 * 1024 <= printed < 6 * 16001
    assert "not-reached" not in result["text"]
    assert session.run("echo next")["text"] == "next\n"  # the mark is for that command only


def test_a_copy_stopped_by_ctrl_c_says_so_as_put_and_get_do(server):
    """It used to print only the ^C the terminal showed: nothing said the copy had not
    been made. (The Ctrl-C comes as the first file is put in place.)"""
    session = Session(server)
    made = session.run("mkdir -p /tiles/3/tree; python -c \"for i in range(5): open(f'/tiles/3/tree/f{i}', 'w').write('x')\"")
    assert made["status"] == 0, made
    changes = server.host.machine.storage.changes

    def first_file_copied(tile, kind, path, path2):
        if tile == 5 and kind == "moved":
            server.interrupt(session.id, session.seq)

    changes.watch(first_file_copied)
    try:
        result = session.run("cp -r /tiles/3/tree /tiles/5/tree", width=80, echoes_ctrl_c=True)
    finally:
        changes.unwatch(first_file_copied)
    assert (result["status"], result["output"]) == (EXIT_INTERRUPTED, [["err", "cp: interrupted\n"]])
    assert session.run("ls /tiles/5/tree")["text"] == "f0\n"  # (it did stop part way)
    session.run("rm -r /tiles/3/tree /tiles/5/tree")


def test_an_interrupt_for_an_old_command_is_ignored(server):
    session = Session(server)
    session.run("echo one")
    server.interrupt(session.id, session.seq)  # arrives late: that command is over
    assert session.run("echo two")["status"] == 0


def test_a_command_interrupted_before_it_started_never_runs(server):
    session = Session(server)
    server.interrupt(session.id, session.seq + 1)  # Ctrl-C while tile 0 was still busy
    result = session.run("mkdir /never-made")
    assert (result["status"], result["output"]) == (EXIT_INTERRUPTED, [["err", "^C\n"]])
    assert session.run("ls /never-made")["status"] == 1
    # several lines queued behind a busy tile 0 and each given up: none of them runs
    for ahead in (1, 2, 3):
        server.interrupt(session.id, session.seq + ahead)
    for name in ("a", "b", "c"):
        assert session.run(f"mkdir /never-{name}")["status"] == EXIT_INTERRUPTED
    assert session.run("ls /never-a /never-b /never-c")["status"] == 1
    assert session.run("mkdir /made")["status"] == 0


def test_completion_of_commands_and_paths(server):
    session = Session(server)
    session.run("mkdir -p '/comp/with space' /comp/dir; touch /comp/file /comp/.hidden")
    assert session.complete("mkd") == (0, ["mkdir "])
    assert session.complete("m") == (0, ["mkdir ", "mount ", "multirepl ", "mv "])
    assert session.complete("ls /comp/") == (3, ["/comp/dir/", "/comp/file ", "/comp/with\\ space/"])
    assert session.complete("ls /comp/.") == (3, ["/comp/.hidden "])
    assert session.complete("echo hi > /comp/f") == (10, ["/comp/file "])
    assert session.complete("kill ") == (5, [])  # job numbers, not paths
    session.run("cd /comp")
    assert session.complete("cat fi") == (4, ["file "])
    assert session.complete("ls /tiles/1") == (3, ["/tiles/1/", "/tiles/10/", "/tiles/11/", "/tiles/12/",
                                                   "/tiles/13/", "/tiles/14/", "/tiles/15/"])
    # in the order ls lists them (numbers as numbers), and only directories for cd
    assert session.complete("ls /tiles/")[1][:3] == ["/tiles/0/", "/tiles/1/", "/tiles/2/"]
    assert session.complete("cd /comp/") == (3, ["/comp/dir/", "/comp/with\\ space/"])
    assert session.complete("rmdir /comp/d") == (6, ["/comp/dir/"])
    assert session.complete("echo > /comp/fi") == (7, ["/comp/file "])


def test_a_completed_name_holding_a_newline_stays_one_word(server):
    """A newline in a name ends a command when the line is read: completed unescaped,
    'cat /notes<LF>rm -r victim' would run the rm."""
    session = Session(server)
    session.run("mkdir -p /nl/victim; touch /nl/victim/keep")
    session.run("python -c 'open(\"/nl/notes\\nrm\\r-r\\rvictim\", \"w\").write(\"x\")'")
    start, (word,) = session.complete("cat /nl/not")
    assert word == "/nl/notes'\n'rm\\\r-r\\\rvictim "
    result = session.run("cd /nl; cat " + word)
    assert result["status"] == 0 and result["output"] == [["out", "x"]]
    assert session.run("ls /nl/victim")["output"] == [["out", "keep\n"]]
    assert session.complete("cat /nl/x\ntouch /nl/vi") == (16, ["/nl/victim/"])  # a new command


def test_listings_on_a_terminal_show_control_characters_as_question_marks(server):
    """A name may hold escape sequences that would drive the terminal (as here, its title
    and a screen clear) or newlines that fake entries: on a terminal, as ls does, they
    show as ?; into a pipe or a file, names are as they are."""
    session = Session(server)
    name = "evil\x1b]0;PWNED\x07\x1b[2J\nfake"
    session.run(f"mkdir /ctl; python -c 'open(\"/ctl/{name.encode('unicode_escape').decode()}\", \"w\")'")
    shown = "evil?]0;PWNED??[2J?fake"
    assert session.run("ls /ctl", width=80)["text"] == shown + "\n"
    assert session.run("ls -l /ctl", width=80)["text"].endswith(f" {shown}\n")
    assert session.run("tree /ctl", width=80)["text"].splitlines()[1] == f"└── {shown}"
    assert session.run("ls /ctl")["text"] == name + "\n"  # not a terminal
    session.run("ls /ctl > /ctl.txt", width=80)
    assert session.run("cat /ctl.txt")["text"] == name + "\n"
    # error messages naming it too (they go to the terminal even when output is redirected)
    for command in ("rmdir /ctl/*fake", "cd /ctl/*fake", "mkdir /ctl/*fake > /ctl-out.txt"):
        errors = [text for stream, text in session.run(command, width=80)["output"] if stream == "err"]
        assert errors and all(shown in text and "\x1b" not in text and text.count("\n") == 1
                              for text in errors), (command, errors)


def test_a_usage_error_on_a_terminal_keeps_its_line_break_and_escapes_what_was_typed(server):
    session = Session(server)
    errors = "".join(text for stream, text in session.run("ls '-\x1b[2J'", width=80)["output"] if stream == "err")
    assert errors == "ls: option -? not recognized\nusage: ls [-l] [-a] [PATH...]\n"


def test_ls_columns_line_up_by_the_width_characters_take_on_a_terminal(server):
    # a CJK character takes two columns, a combining accent none
    session = Session(server)
    wide = "a\u65e5\u672c\u8a9e\u65e5\u672c\u8a9e.txt"  # 17 columns
    session.run(f"mkdir /wide; touch /wide/{wide} /wide/e\u0301t\u00e9 /wide/abcdefghij /wide/x")
    assert session.run("ls /wide", width=40)["text"] == (
        "abcdefghij" + " " * 9 + "e\u0301t\u00e9\n"
        + wide + "  x\n")


def test_names_of_digit_like_characters_sort_with_the_rest(server):
    # "²" is str.isdigit() but no int: ls, tree and du failed on it and listed nothing
    session = Session(server)
    session.run("mkdir /sq; touch /sq/1\u00b2 /sq/\u00b2 /sq/a10 /sq/a9 /sq/\u0661\u0662")
    assert session.run("ls /sq")["text"].split() == ["1\u00b2", "\u0661\u0662", "a9", "a10", "\u00b2"]
    for command in ("tree /sq", "du /sq"):
        assert session.run(command)["status"] == 0, command


def test_a_quoted_character_a_glob_bracket_would_read_as_syntax_is_refused(server):
    # [\!a]* matched what [!a]* does, so rm removed the files it was told to keep
    session = Session(server)
    session.run("mkdir /bang; cd /bang; touch -- !x ax bx 'a]' -y")
    refused = session.run("rm [\\!a]*")
    assert refused["status"] == 2 and "a quoted '!' inside a glob's [...] is not supported" in refused["text"]
    for line in ("rm [a'-'b]*", 'rm [x"]"]*'):
        assert session.run(line)["status"] == 2, line
    assert session.run("ls -a /bang")["text"].split() == [".", "..", "!x", "-y", "a]", "ax", "bx"]
    assert session.run("""echo [a!]x [\\^a]x ['-'a]y [b'*']x ["]"a]x""")["text"] == "!x ax ax -y bx ax\n"


def test_closing_a_session_forgets_it(server):
    session = Session(server)
    session.run("python -c 'x = 1'")
    call(server, "shell.close", session.id)
    with pytest.raises(LookupError, match="no shell session"):
        session.run("echo gone")


def test_a_put_that_does_not_finish_leaves_no_partial_file(server):
    """Its file goes when the terminal gives the put up, else when the session's next put
    starts (the terminal may not have been able to say) or when the session closes."""
    session = Session(server)
    session.run("mkdir /pa /pb /pc")

    def put(directory, last):
        return call(server, "shell.put", session.id, directory, "f", b"partial", 0, last)

    def partial_files():
        return Session(server).run("ls -a /pa /pb /pc")["text"].count(".ipuos-put-")

    put("/pa", False)
    assert partial_files() == 1
    assert put("/pb", True) == "/pb/f"
    assert partial_files() == 0
    put("/pc", False)
    call(server, "shell.put_abort", session.id)
    assert partial_files() == 0
    put("/pa", False)
    call(server, "shell.close", session.id)
    assert partial_files() == 0


def test_a_session_closed_while_a_multirepl_block_runs_answers_that_block(server):
    # the terminal went away (or the machine is halting) during a block: the block still
    # ends with a state the closed session can give, not an AttributeError
    session = Session(server)
    assert session.run("multirepl --tiles 1-2")["prompt"] == "[1-2]>>> "
    result = _close_while_a_block_runs(server, session)
    assert "the shell's terminal went away" in result["text"]
    assert result["prompt"].startswith("ipuos:")


def _close_while_a_block_runs(server, session) -> dict:
    """Close ``session`` while a block of its multirepl runs, as a terminal that went away
    does, and stop the block; returns the block's answer."""
    import threading

    done = {}

    def block():
        done["result"] = session.run("while True:\n    sync()\n")

    running = threading.Thread(target=block)
    running.start()
    state = server.sessions[session.id]
    while state.job is None:
        pass
    job = state.job
    call(server, "shell.close", session.id)  # served while the block's command waits for its job
    server.scheduler.interrupt_job(job, "the shell's terminal went away")
    running.join(30)
    return done["result"]


_GOODBYE = ("class Goodbye:\n    def __del__(self):\n        print('bye from', __physical_tile)\n"
            "        with open('/goodbye.txt', 'w') as file:\n"
            "            file.write(f'written by tile {__physical_tile}')\n\n"
            "goodbye = Goodbye()\n")


def _wait_for_jobs(server) -> None:
    for job in server.scheduler.live_jobs():
        job.future.result(30)


def _take_goodbyes(server, tiles) -> list[bytes]:
    fs = server.host.machine.fs
    found = [fs.read_file(tile, "/goodbye.txt") for tile in tiles]
    for tile in tiles:
        fs.remove(tile, "/goodbye.txt")
    return found


def test_leaving_the_multirepl_shows_what_its_tiles_print_as_they_let_go(server):
    """As a program's end: each tile's objects go on that tile, printing as it."""
    session = Session(server)
    session.run("multirepl --tiles 1-2")
    session.run(_GOODBYE)
    result = session.run("exit")
    assert (result["text"], result["mode"]) == ("[1 tile: 1]\nbye from 1\n[1 tile: 2]\nbye from 2\n", "shell")
    assert _take_goodbyes(server, [1, 2]) == [b"written by tile 1", b"written by tile 2"]


def test_ctrl_c_while_the_multirepl_ends_stops_a_del_that_never_ends(server):
    import threading

    session = Session(server)
    session.run("multirepl --tiles 1-2")
    session.run(_GOODBYE + "\nclass Stuck:\n    def __del__(self):\n        while True:\n            sync()\n\n"
                "stuck = Stuck()\n")
    done = {}
    leaving = threading.Thread(target=lambda: done.update(result=session.run("exit")))
    leaving.start()
    state = server.sessions[session.id]
    deadline = time.monotonic() + 10
    while state.job is None and time.monotonic() < deadline:  # (the shell waits for the session's end)
        pass
    server.interrupt(session.id, session.seq)
    leaving.join(30)
    text = done["result"]["text"]
    # (a KeyboardInterrupt in each __del__, as Python gives a Ctrl-C: see TileKeyboardInterrupt)
    assert text.count("TileKeyboardInterrupt: interrupted (Ctrl-C)\n") == 2 and "bye from 1\n" in text
    assert done["result"]["mode"] == "shell"
    assert _take_goodbyes(server, [1, 2]) == [b"written by tile 1", b"written by tile 2"]


@pytest.mark.parametrize("mode, tiles", [("python", [0]), ("multirepl --tiles 1-2", [1, 2])])
def test_a_closed_sessions_repls_let_go_on_their_tiles(server, mode, tiles):
    """The terminal went away: nobody sees what they print, but the objects still go on
    their tiles, with their tiles' files."""
    session = Session(server)
    session.run(mode)
    session.run(_GOODBYE)
    call(server, "shell.close", session.id)
    _wait_for_jobs(server)
    assert _take_goodbyes(server, tiles) == [f"written by tile {tile}".encode() for tile in tiles]


def test_a_session_closed_while_its_block_runs_lets_go_once_the_block_stops(server):
    session = Session(server)
    session.run("multirepl --tiles 1-2")
    session.run(_GOODBYE)
    _close_while_a_block_runs(server, session)
    _wait_for_jobs(server)
    assert _take_goodbyes(server, [1, 2]) == [b"written by tile 1", b"written by tile 2"]


def test_repl_data_takes_sram_like_a_programs():
    with ipuos.Machine("tiny") as machine:
        memory = machine.sram.memory(1)

        def data_regions():
            return [r.name for r in memory.regions if r.name.endswith(".tiledata")]

        # 60 KB: more than a tile has free, so the session would fail every block
        with pytest.raises(ValueError, match=r"^the data \(60000 bytes\) does not fit in the SRAM of 1 tile "
                                             r"\(1\): tile 1's share is 60000 bytes, and it has room for \d+ "):
            machine.repl(tiles="1", data="word\n" * 12000)
        # room that goes between the start and the first block, which takes the share: each block says so
        repl = machine.repl(tiles="1", data="word " * 2000)
        machine.scheduler.call_wait(lambda: memory.alloc("filler", memory.largest_free()))
        result = repl.run("print(len(__tiledata))")
        assert "MemoryError: tile 1: cannot allocate 10000 B of SRAM" in result.format()
        machine.scheduler.call_wait(memory.free, "filler")
        repl.close()
        repl = machine.repl(tiles="1-2", data="small\nlines\n")
        assert repl.run("print(__tiledata, end='')").format() == "[1 tile: 1]\nsmall\n[1 tile: 2]\nlines\n"
        assert len(data_regions()) == 1  # kept while the session lasts
        repl.close()
        assert data_regions() == []


def test_exit_with_a_status_leaves_the_multirepl(server):
    """A block of just ``exit(N)`` is reported as any block calling exit() is (it left
    silently); ``exit`` and ``exit()`` alone leave quietly, keeping the last status."""
    session = Session(server)
    session.run("multirepl --tiles 1-2")
    result = session.run("exit(3)")
    assert result["status"] == 3 and result["prompt"].startswith("ipuos:")
    assert result["output"] == [["err", "multirepl ended: exit() on tiles 1-2 (status 3)\n"]]
    for line in ("exit", "exit()", "quit( )"):
        session.run("multirepl --tiles 1-2")
        session.run("x = 1/0")
        result = session.run(line)
        assert (result["status"], result["mode"], result["output"]) == (1, "shell", []), line


@pytest.mark.parametrize("block, status", [("exit(-1)", 255), ("exit('bye')", 1), ("exit (2)", 2),
                                           ("raise SystemExit", 0),
                                           ("if __tileid == __numtiles - 1:\n    exit(5)\n", 5)])
@pytest.mark.parametrize("mode", ["python", "multirepl --tiles 1-2"])
def test_any_exit_a_block_calls_leaves_python_and_multirepl(server, mode, block, status):
    """As Python's own REPL: exit() anywhere in a block leaves, with its status."""
    session = Session(server)
    session.run(mode)
    result = session.run(block)
    assert (result["status"], result["mode"]) == (status, "shell"), result
    assert session.run("pwd")["text"] == "/\n"  # a shell command again
    result = session.run("python -c 'exit(4)'")  # one block in the shell: the shell stays
    assert (result["status"], result["mode"]) == (4, "shell")
    # the message of exit('bye') goes where Python prints it: the error stream
    streamed = []
    result = session.run("python -c \"print('out'); exit('bye')\"", emit=streamed.extend)
    assert (result["status"], streamed + result["output"]) == (1, [["out", "out\n"], ["err", "bye\n"]]), result


def test_exit_on_some_tiles_ends_the_multirepl_saying_where_and_with_which_status(server):
    """The next line goes to the shell: it must be said why (it used to end silently)."""
    session = Session(server)
    session.run("multirepl --tiles 1-6")
    result = session.run("print('ran')\nif __tileid == 2:\n    exit(3)\n")
    assert (result["status"], result["mode"]) == (3, "shell"), result
    assert result["output"] == [["out", "[5 tiles: 1-2,4-6]\nran\n[1 tile: 3]\nran\n"],
                                ["err", "multirepl ended: exit() on tile 3 (status 3)\n"]]
    session.run("multirepl --tiles 1-6")
    result = session.run("if __tileid % 2:\n    exit(-1)\nelif __tileid:\n    raise SystemExit\n")
    assert (result["status"], result["mode"]) == (255, "shell"), result
    assert result["output"] == [["err", "multirepl ended: exit() on tiles 3,5 (status 0) and tiles 2-6:2 "
                                        "(status 255)\n"]]
    session.run("python")  # (one tile: as Python's REPL, it just leaves)
    result = session.run("exit (4)")
    assert (result["status"], result["mode"], result["output"]) == (4, "shell", []), result


def test_a_repl_block_raising_a_base_exception_shows_only_the_programs_frames():
    with ipuos.Machine("tiny") as machine:
        repl = machine.repl(tiles="1-2")
        text = repl.run("if __tileid == 1:\n    raise KeyboardInterrupt('x')\nprint('after', __tileid)\n").format()
        assert "KeyboardInterrupt: x" in text and "after 0" in text
        assert "_scheduler.py" not in text and "_runtime.py" not in text
        assert repl.run("print('still here')").format() == "[2 tiles: 1-2]\nstill here\n"
        repl.close()


def test_python_with_its_code_joined_to_c_is_one_block_not_the_python_mode(server):
    """``python -cCODE`` is ``python -c CODE`` (as the command reads its options): it may be
    followed on its line and redirected, as one block."""
    session = Session(server)
    result = session.run("python -c'print(1)'; echo after")
    assert (result["status"], result["text"], result["mode"]) == (0, "1\nafter\n", "shell"), result
    assert session.run("python -c'print(2)' > /joined.txt")["status"] == 0
    assert session.run("cat /joined.txt")["text"] == "2\n"
    result = session.run("python -x; echo after")  # a bad option: its own usage error, then on
    assert result["status"] == 0 and result["text"].endswith("after\n"), result
