"""The terminal front-end: the only part of the shell that runs on the host.

It reads lines (prompt_toolkit on a terminal: line editing, history in the user's home,
Tab completion asked of tile 0; plain reads from a pipe or ``-c``), sends them to the
session on tile 0 through a :class:`~ipuos.shell.Transport`, and prints what comes back.
Everything a line does to files happens on tile 0.

It carries out itself only what needs the host: ``put``/``get`` (it reads or writes the
host file and moves the bytes; tile 0 never touches the host), ``history``, ``clear``,
``exit``, and reading the host file of ``multirepl --data``. It never runs a host
command: a name the shell does not know is ``command not found``, from tile 0.

In python and multirepl modes it collects lines until they form a whole block (the
interactive interpreter's rule, see ``_blocks``), so a ``for`` loop reaches the tiles as
one job; Ctrl-D leaves the mode, Ctrl-D in the shell (or ``exit``) leaves the shell.
"""

from __future__ import annotations

import errno
import glob
import os
import re
import shutil
import stat
import sys
import tempfile
import termios
from collections.abc import Callable
from pathlib import Path

from prompt_toolkit import PromptSession
from prompt_toolkit.application import get_app
from prompt_toolkit.buffer import CompletionState
from prompt_toolkit.completion import CompleteEvent, Completer, Completion, get_common_complete_suffix
from prompt_toolkit.filters import Condition, is_searching
from prompt_toolkit.history import FileHistory, InMemoryHistory
from prompt_toolkit.input.typeahead import clear_typeahead
from prompt_toolkit.key_binding import KeyBindings
from prompt_toolkit.key_binding.bindings import search as search_bindings

from ipuos._readlimit import read_at_most
from ipuos._terminate import Terminated, on_termination
from ipuos._tilespec import TileSpecError, format_tiles, parse_tiles

from ._blocks import block_complete, inside_compound_statement
from ._complete import complete_host_path, host_word
from ._parse import ShellSyntaxError, Word, continues_on_next_line, parse_line
from ._progcmds import enters_repl, meant_to_enter_repl, multirepl_options
from ._protocols import RemoteError
from ._session import SHELL
from ._table import COMMANDS, Usage, options

__all__ = ["Terminal", "history_path"]

#: bytes per put/get request
TRANSFER_CHUNK = 1 << 20
EXIT_INTERRUPTED = 130


def _after_double_dash(args: list[str]) -> list[str]:
    """The operands of a terminal command that takes no options: ``--`` may end them,
    as it does for every command."""
    return args[1:] if args[:1] == ["--"] else args


def _continuation(width: int, line_number: int, wrap_count: int) -> str:
    """What starts each further row of a shell line being typed: ``> `` for a line that
    goes on after Enter inside a quote (or after a trailing ``\\``), as sh's PS2; nothing
    for a row that is only the terminal wrapping a long line, which is no continuation."""
    return "" if wrap_count else "> "


#: the file of Python lines (python and multirepl mode), beside the shell's history
PYTHON_HISTORY_NAME = "python-history"
#: the history kind of python and multirepl lines
_PYTHON_LINES = "python"


def history_path() -> Path:
    """``$XDG_DATA_HOME/ipuos/history``, else ``~/.local/share/ipuos/history``. A relative
    ``$XDG_DATA_HOME`` is ignored, as the XDG spec says (it would put the history in
    whatever directory the shell was started from)."""
    base = os.environ.get("XDG_DATA_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "ipuos" / "history"


def _private_file(path: Path) -> None:
    """Create the history file (and its directory) readable by the user only: it holds
    everything typed, which may include data."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def _ending_backslash(text: str, command_text: bool) -> str:
    """``text``, the end of a script, as sh reads a ``\\`` that ends it outside quotes:
    piped, it escapes the last newline, which goes with it; ending a ``-c`` text, with
    nothing after it to escape, it is itself."""
    if not text.endswith("\\") or continues_on_next_line(text[:-1]):
        return text
    return text + "\\" if command_text else text[:-1]



class KeptHistory(FileHistory):
    """A history file that may stop taking lines mid-session (its disk full, its directory
    removed): that is said once, and the session's lines are kept in memory only.
    (prompt_toolkit let the OSError out of every line entered: a traceback, and a line
    run only after one more Enter.)"""

    def __init__(self, filename: str, warn: Callable[[str], None]):
        super().__init__(filename)
        self._warn = warn
        self._failed = False

    def store_string(self, string: str) -> None:
        if self._failed:
            return
        try:
            super().store_string(string)
        except OSError as exc:
            self._failed = True
            self._warn(f"ipuos: history is not kept from here on: {self.filename}: {exc.strerror}\n")

class Terminal:
    """One attached terminal (see module doc). ``state`` is the session's first state."""

    def __init__(self, transport, state: dict, *, stdout=None, stderr=None,
                 history_file: Path | None = None, exit_on_leave: bool = False,
                 max_payload: int | None = None):
        self.transport = transport
        #: the most bytes one request to the machine may carry (None: no limit known)
        self.max_payload = max_payload
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.mode = state.get("mode", SHELL)
        self.prompt = state.get("prompt", "$ ")
        self.status = state.get("status", 0)
        #: the machine's tiles and each one's SRAM: what ``multirepl --data`` can take
        self.machine_tiles = state["ntiles"]
        self.sram_per_tile = state["sram_per_tile"]
        #: lines of a block being typed in a repl mode
        self.block: list[str] = []
        #: leave the program when a repl mode ends (``ipuos repl``)
        self.exit_on_leave = exit_on_leave
        self.history_file = history_file
        self._histories: dict = {}
        self.interactive = False
        self._done = False
        #: the session ended under the terminal (the machine halted or went away)
        self._session_ended = False
        #: python or the multirepl has run in this session: tiles may hold its names
        self._names_made = self.mode != SHELL
        #: the last command was stopped by the user's Ctrl-C: a script stops there, as a
        #: bash script does (a program's own exit status 130 is not one)
        self.ctrl_c = False
        #: what was written last ended its line: the prompt line editor draws from the
        #: first column, over what a line left open shows (``echo -n``, ``cat`` of a file
        #: with no final newline)
        self._at_line_start = True

    # -- input loops --------------------------------------------------------------------------

    def run_script(self, lines, *, command_text: bool = False) -> int:
        """Run lines from ``-c`` (``command_text``: a list) or a pipe; the status is the
        last command's. A failed command does not stop the lines after it, except python
        or multirepl failing to start: its input follows, which is not shell commands."""
        remaining = iter(lines)
        read = 0  # (lines read so far: for -c, whether this line is its last)
        try:
            for line in remaining:
                read += 1
                line = line.rstrip("\n")
                if self.mode == SHELL:
                    # a quote (or a \) that goes on in the next line: that line is part of
                    # this command, never a command of its own, as in sh; a repl's lines
                    # are its input, left as they are
                    while continues_on_next_line(line):
                        following = next(remaining, None)
                        if following is None:
                            line = _ending_backslash(line, command_text)
                            break  # (an unterminated quote: tile 0 refuses the whole)
                        read += 1
                        line += "\n" + following.rstrip("\n")
                if command_text and read == len(lines) and self._refused_as_repl_without_input(line):
                    return self.status
                repl = self._repl_meant(line)
                self.feed(line, read=True)
                # (Ctrl-C stops the script, as it stops a bash script, not just its command)
                if self.ctrl_c:  # (130 even if the command was done before it could stop it)
                    return EXIT_INTERRUPTED
                if self._done:
                    return self.status
                if repl is not None and self.mode == SHELL:
                    # the lines after it are Python for the repl: as shell commands they
                    # could do anything (an `rm -r` in a string), so the script ends here
                    if next(remaining, None) is not None:
                        self._write_err(f"{repl}: did not start, so the script stops here (the "
                                        "lines after it are its input, not shell commands)\n")
                    return self.status
            if self.block:
                self._run_block()
            if self.mode != SHELL and not self._done:
                self._execute("", eof=True)
        except KeyboardInterrupt:
            self._report_ctrl_c()
            return EXIT_INTERRUPTED
        return self.status

    def finish(self, status: int) -> int:
        """The input has ended with ``status``: the tiles let go of the ``python`` and
        multirepl names, and what their ``__del__`` methods print is shown, as Python
        shows it at exit. Returns the exit status: ``status``, unless a Ctrl-C stopped
        that or the session has ended meanwhile."""
        if self._session_ended or not self._names_made:
            return status  # (nothing to let go of: no request)
        self.status = status
        if self.mode != SHELL:  # (a script stopped inside python or the multirepl: leave it)
            self._execute("", eof=True)
        if self.mode == SHELL and not (self.ctrl_c or self._session_ended):
            self._execute("", eof=True)
        return self.status if self.ctrl_c or self._session_ended else status

    def interact(self) -> int:
        """The interactive loop on a terminal (prompt_toolkit)."""
        self.interactive = True
        bindings = KeyBindings()

        def _at_indentation() -> bool:
            line = get_app().current_buffer.document.current_line_before_cursor
            return self.mode != SHELL and not line.strip()

        @bindings.add("tab", filter=Condition(_at_indentation) & ~is_searching)
        def _indent(event):  # (anywhere else Tab completes, as in Python's own REPL)
            event.current_buffer.insert_text("    ")

        completer = _TileCompleter(self)

        @bindings.add("tab", filter=~Condition(_at_indentation) & ~is_searching)
        def _complete(event):
            _complete_now(event.current_buffer, completer)

        # in a Ctrl-R search Tab ends the search and leaves the line found to be edited,
        # as readline's does (completing there went to the search text, or did nothing)
        bindings.add("tab", filter=is_searching)(search_bindings.accept_search)

        # Enter runs the line found, as readline's does (it only ended the search)
        bindings.add("enter", filter=is_searching)(search_bindings.accept_search_and_accept_input)

        def _continues() -> bool:
            return self.mode == SHELL and continues_on_next_line(get_app().current_buffer.text)

        @bindings.add("enter", filter=Condition(_continues))
        def _next_line(event):
            # an open quote or a final \: Enter goes on to a "> " line, as in sh, rather
            # than run the line (whatever was typed in the quote would run as commands)
            buffer = event.current_buffer
            buffer.cursor_position = len(buffer.text)
            buffer.insert_text("\n")

        def _on_an_empty_continuation_line() -> bool:
            document = get_app().current_buffer.document
            return _continues() and document.current_line == ""

        @bindings.add("c-d", filter=Condition(_on_an_empty_continuation_line) & ~is_searching)
        def _end_of_input_in_a_quote(event):
            # Ctrl-D on an empty "> " line: the line runs as it is, and is refused as sh
            # refuses it (a quote never closed), rather than the key doing nothing (where
            # something is typed it deletes a character, as readline's does)
            event.current_buffer.validate_and_handle()

        # shell lines and Python lines each have a history of their own, as bash's and
        # Python's do: Up in python mode brings back Python, not a shell command
        sessions: dict[str, PromptSession] = {}
        active: list[PromptSession] = []

        def session_for(kind: str) -> PromptSession:
            if kind not in sessions:
                # enable_suspend: Ctrl-Z stops the shell at the prompt as it does while a
                # command runs (without it, a literal ^Z went into the line)
                sessions[kind] = PromptSession(history=self._load_history(kind), completer=completer,
                                               complete_while_typing=False, key_bindings=bindings,
                                               enable_suspend=True,
                                               prompt_continuation=_continuation if kind == SHELL else None)
            return sessions[kind]

        lost: list[str] = []
        #: termination signals that came while a prompt had the terminal in raw mode
        ending: list[int] = []
        prompting = [False]

        def session_lost(why: str) -> None:  # (from the thread holding the session)
            lost.append(why)
            _end_prompt(active[0] if active else None)

        def terminated(signum: int) -> None:
            if not prompting[0]:
                raise Terminated(signum)  # a command runs: the terminal is as the user had it
            # the prompt must put the terminal back (raw mode, bracketed paste) as it ends
            ending.append(signum)
            _end_prompt(active[0] if active else None)

        when_lost = getattr(self.transport, "when_lost", None)
        if when_lost is not None:  # (a transport that cannot lose its session has none)
            when_lost(session_lost)
        with on_termination(terminated):
            while not self._done:
                if lost:
                    self._write_err(f"\nipuos: {lost[0]}\n")
                    self.status = 1
                    self._session_ended = True  # (finish must not ask, and say it again)
                    break
                session = session_for(SHELL if self.mode == SHELL else _PYTHON_LINES)
                active[:] = [session]
                if not self._at_line_start:
                    self._output("out", "\n")
                try:
                    prompting[0] = True
                    try:
                        line = session.prompt(self.prompt if not self.block else "... ",
                                              pre_run=lambda: (lost or ending) and _end_prompt(session))
                    finally:
                        prompting[0] = False
                        if ending:  # (whatever the prompt ended with: the terminal is back)
                            raise Terminated(ending[0])
                except _PromptEnded:
                    continue  # (the session is lost: said at the top of the loop)
                except KeyboardInterrupt:
                    self.block = []
                    continue
                except EOFError:
                    if self.mode == SHELL:
                        break
                    if self.block:  # Ctrl-D at "...": the block ends there and runs (as Python's)
                        self._run_block()
                        continue
                    self._execute("", eof=True)
                    continue
                self.ctrl_c = False  # (this entry's: an entry that runs nothing leaves it as it was)
                self._feed_entry(line)
                if self.ctrl_c:
                    # Ctrl-C drops what was typed ahead of the command, as a terminal does: the
                    # kernel flushed what nobody had read at the ^C (and keeps what is typed
                    # after it); prompt_toolkit keeps keys it had read for the next prompt, and
                    # the lines of a paste without bracketed paste ran after the Ctrl-C
                    clear_typeahead(session.input)
        return self.status

    def _feed_entry(self, text: str) -> None:
        """What was entered at the prompt. Lines pasted at once run one after another,
        as a script's: a line that starts python or multirepl takes the lines after it as
        its input (and if it does not start, they do not run as shell commands)."""
        if self.mode != SHELL or "\n" not in text:
            self.feed(text)
            return
        lines = iter(text.split("\n"))
        for line in lines:
            repl = None
            if self.mode == SHELL:
                while continues_on_next_line(line):  # (a quote that goes on: one command)
                    following = next(lines, None)
                    if following is None:
                        break
                    line += "\n" + following
                repl = self._repl_meant(line)
            self.feed(line)
            if self._done or self.ctrl_c:
                return
            if repl is not None and self.mode == SHELL:
                if any(rest.strip() for rest in lines):
                    self._write_err(f"{repl}: did not start, so the pasted lines after it do not run (they "
                                    "are its input, not shell commands)\n")
                return

    def _load_history(self, kind: str = SHELL):
        """The history of shell lines (``history_file``) or of Python lines (beside it)."""
        history = self._histories.get(kind)
        if history is None:
            path = self.history_file
            if path is not None and kind != SHELL:
                path = path.with_name(PYTHON_HISTORY_NAME)
            if path is None:
                history = InMemoryHistory()
            else:
                try:
                    _private_file(path)
                    history = KeptHistory(str(path), self._write_err)
                except OSError as exc:
                    self._write_err(f"ipuos: history is not kept: {path}: {exc.strerror}\n")
                    history = InMemoryHistory()
            self._histories[kind] = history
        return history

    # -- one line -----------------------------------------------------------------------------

    def feed(self, line: str, *, read: bool = False) -> None:
        """One line typed (or ``read`` from a script or pipe): a shell line, or part of a
        repl block."""
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:  # bytes that are not UTF-8, read with surrogateescape
            self._write_err("ipuos: a line that is not UTF-8 text was skipped: "
                            f"{line.encode('utf-8', 'backslashreplace').decode('ascii', 'replace')}\n")
            self.status = 1
            return
        if self.mode != SHELL:
            self.block.append(line)
            if not (read and inside_compound_statement(self.block)) and block_complete("\n".join(self.block)):
                self._run_block()
            return
        try:
            commands = parse_line(line)
        except ShellSyntaxError:
            self._execute(line)  # tile 0 says what is wrong, like any other error
            return
        if not any(_is_local(command) for command in commands):
            if commands:
                self._execute(line)
            return
        if any(command.name == "multirepl" for command in commands[:-1]):
            self._fail("multirepl", "must be the last command on its line (the lines that follow "
                       "are its input)", 2)
            return
        for command in commands:
            if _is_local(command):
                self._run_local(command)
            else:
                self._execute(command.text)
            if self._done or self.mode != SHELL or self.ctrl_c:
                break

    def _repl_meant(self, line: str) -> str | None:
        """The repl (python or multirepl) a shell line starts, meant to take the lines
        after it, whether or not it will start (None: none). Anywhere on the line: one
        before its end is refused (it must be last), and its lines must not then run as
        shell commands either."""
        if self.mode != SHELL:
            return None
        try:
            commands = parse_line(line)
        except ShellSyntaxError:
            return None  # (nothing of it runs: tile 0 says what is wrong)
        return next((command.name for command in commands if meant_to_enter_repl(command)), None)

    def _refused_as_repl_without_input(self, line: str) -> bool:
        """A ``-c`` text that ends by starting python or multirepl: their input would be
        the lines after it in the text, and there are none, so it would start and end
        at once, silently (``sh -c python`` reads stdin, but here the text is the input;
        piped lines are read by ``ipuos shell`` or ``ipuos repl`` without -c). Refuse
        the line, status 2, before anything of it runs."""
        if self.mode != SHELL:
            return False
        try:
            commands = parse_line(line)
        except ShellSyntaxError:
            return False  # (tile 0 says what is wrong)
        if not commands or not enters_repl(commands[-1]) or commands[-1].redirect is not None:
            return False  # (a redirected repl is refused on tile 0, saying why)
        name = commands[-1].name
        hint = "python -c CODE runs one block" if name == "python" else "ipuos repl reads blocks from a pipe"
        self._fail(name, f"its input is the lines after it in the -c text, and there are none ({hint})", 2)
        return True

    def _run_block(self) -> None:
        source = "\n".join(self.block)
        self.block = []
        self._execute(source)

    def _execute(self, line: str, *, payload: bytes = b"", eof: bool = False) -> None:
        self.ctrl_c = False
        try:
            result = self.transport.execute(line, payload=payload, eof=eof, on_output=self._output,
                                            width=self._width(), echoes_ctrl_c=self._echoes_ctrl_c())
        except KeyboardInterrupt:
            self._report_ctrl_c(" (stopped waiting; tile 0 is still stopping the command)")
            self.status = EXIT_INTERRUPTED
            self.ctrl_c = True
            return
        except RemoteError as exc:
            self._write_err(f"ipuos: {exc}\n")
            self.status = 1
            if getattr(exc, "fatal", False):
                self._done = self._session_ended = True
            return
        if result.get("ended"):  # the machine halts: as when it does at the prompt (1, not a Ctrl-C's 130)
            self._write_err(f"ipuos: the shell session ended: {result['ended']}\n")
            self.status = 1
            self._done = self._session_ended = True
            return
        was_repl = self.mode != SHELL
        self.status = result["status"]
        self.ctrl_c = result.get("ctrl_c", False)
        self.mode = result["mode"]
        self._names_made = self._names_made or self.mode != SHELL
        self.prompt = result["prompt"]
        if was_repl and self.mode == SHELL and self.exit_on_leave:
            self._done = True

    def _output(self, stream: str, text: str) -> None:
        target = self.stderr if stream == "err" else self.stdout
        target.write(text)
        target.flush()
        if text:
            self._at_line_start = text.endswith("\n")

    def _write_err(self, text: str) -> None:
        self._output("err", text)

    def _width(self) -> int:
        return shutil.get_terminal_size().columns if self.interactive else 0

    def _echoes_ctrl_c(self) -> bool:
        """Whether a Ctrl-C shows as ``^C`` by itself where the shell writes its messages:
        a terminal that echoes control characters (Linux's do, unless told not to)."""
        try:
            flags = termios.tcgetattr(self.stderr.fileno())[3]
        except (OSError, ValueError, AttributeError, termios.error):  # not a terminal
            return False
        return bool(flags & termios.ECHO and flags & termios.ECHOCTL)

    def _report_ctrl_c(self, text: str = "") -> None:
        """``^C`` and ``text`` on a line, without the ``^C`` the terminal showed already."""
        self._write_err(("" if self._echoes_ctrl_c() else "^C") + text + "\n")

    def _after_ctrl_c(self) -> None:
        """End the line the terminal's ``^C`` is on, if it showed one: a report follows."""
        if self._echoes_ctrl_c():
            self._write_err("\n")

    # -- what the terminal does itself ----------------------------------------------------------

    def _run_local(self, command) -> None:
        name, args = command.name, command.argv[1:]
        if command.redirect is not None and name != "multirepl":
            self._fail(name, "cannot redirect the output of a terminal command", 2)
            return
        if name in ("put", "get"):
            args = self._transfer_args(name, command)
            if args is None:
                return
        handler = getattr(self, f"_local_{name}")
        self.ctrl_c = False
        try:
            handler(args, command)
        except KeyboardInterrupt as exc:
            self._after_ctrl_c()
            self._fail(name, str(exc) or "interrupted", EXIT_INTERRUPTED)
            self.ctrl_c = True
        except RemoteError as exc:
            self._fail(name, str(exc))
        except OSError as exc:
            where = f"{exc.filename}: " if exc.filename else ""
            self._fail(name, f"{where}{exc.strerror or exc}")

    def _transfer_args(self, name: str, command) -> list[str] | None:
        """put/get words with the host file's pattern expanded here (it must match one
        file); a pattern on the chip side is refused: it would become a literal name.
        Their options are read as tile 0's commands read theirs: there are none, and ``--``
        ends them (``put -- -x.dat``)."""
        words = command.words[1:]
        texts = [word.text for word in words]
        try:
            options(texts, "")
        except Usage as exc:
            self._fail(name, f"{exc}\nusage: {COMMANDS[name].usage}", 2)
            return None
        if "--" in texts:  # (with no options, the first -- is the one that ends them)
            del words[texts.index("--")]
        args = []
        for index, word in enumerate(words):
            on_host = (index == 0) == (name == "put")
            if not on_host and word.pattern is None:
                args.append(word.text)
            elif not on_host:
                self._fail(name, f"{word.text}: name the file on the chip without * ? [ ] "
                                 "(they are not expanded here; `ls` shows the names)", 2)
                return None
            else:
                host = self._host_file(name, word)
                if host is None:
                    return None
                args.append(host)
        return args

    def _host_file(self, name: str, word, taker: str | None = None) -> str | None:
        """The host file ``word`` names, its pattern (if it has one) expanded here: it
        must match one file (None: it does not, and command ``name`` has said so;
        ``taker``: what takes one file, the command if not given)."""
        if word.pattern is None:
            return os.path.expanduser(word.text) if word.tilde else word.text
        matches = sorted(glob.glob(os.path.expanduser(word.pattern) if word.tilde else word.pattern))
        if len(matches) == 1:
            return matches[0]
        if matches:
            why = f"matches {len(matches)} files; {taker or name} takes one"
        elif name == "get":  # (bash would write a file named as the pattern)
            why = "matches no file; to write a new file, name it without * ? [ ] (or quote them)"
        else:
            why = "matches no file"
        self._fail(name, f"{word.text}: {why}")
        return None

    def _fail(self, name: str, message: str, status: int = 1) -> None:
        self._write_err(f"{name}: {message}\n")
        self.status = status

    def _local_exit(self, args, command) -> None:
        args = _after_double_dash(args)  # (a status may be negative: -1 is no option)
        if len(args) > 1 or (args and not re.fullmatch(r"-?[0-9]+", args[0], re.ASCII)):
            self._fail("exit", "usage: exit [STATUS]", 2)
            return
        if args:
            self.status = int(args[0]) & 0xFF
        self._done = True

    def _local_clear(self, args, command) -> None:
        if _after_double_dash(args):
            self._fail("clear", "usage: clear", 2)
            return
        self.stdout.write("\x1b[H\x1b[2J")
        self.stdout.flush()
        self._at_line_start = True
        self.status = 0

    def _local_history(self, args, command) -> None:
        if _after_double_dash(args):
            self._fail("history", "usage: history", 2)
            return
        lines = list(reversed(list(self._load_history().load_history_strings()))) \
            if not self.interactive else list(self._load_history().get_strings())
        width = len(str(len(lines)))
        indent = "\n" + " " * (width + 2)  # (a pasted block is one entry of several lines)
        self.stdout.write("".join(f"{i:>{width}}  {line.rstrip(chr(10)).replace(chr(10), indent)}\n"
                                  for i, line in enumerate(lines, 1)))
        self.stdout.flush()
        self.status = 0

    def _local_put(self, args, command) -> None:
        if not 1 <= len(args) <= 2:
            self._fail("put", f"usage: {COMMANDS['put'].usage}", 2)
            return
        host = args[0]  # (~ expanded if unquoted: see _host_file)
        target = args[1] if len(args) == 2 else "."

        def chunks(file):
            while True:
                data = file.read(TRANSFER_CHUNK)
                if not data:
                    return
                yield data

        interrupted = []
        with open(host, "rb") as file:
            written = self.transport.put(target, chunks(file), os.path.basename(host.rstrip("/")),
                                         on_interrupt=lambda: interrupted.append(True))
        if interrupted:  # too late: the copy was complete, and is in place
            self.ctrl_c = True
            self._after_ctrl_c()
            self._write_err(f"put: {host} -> {written}: copied before the Ctrl-C could stop it\n")
        elif self.interactive:
            self.stdout.write(f"{host} -> {written}\n")
        self.status = 0

    def _local_get(self, args, command) -> None:
        if not 1 <= len(args) <= 2:
            self._fail("get", f"usage: {COMMANDS['get'].usage}", 2)
            return
        name = args[0].rstrip("/").rpartition("/")[2]
        host = args[1] if len(args) == 2 else name
        if not host:
            if name:
                self._fail("get", "the host file name is empty", 2)
            else:  # (the root: a directory, which has no name to give its copy either)
                self._fail("get", f"{args[0]}: {os.strerror(errno.EISDIR)}", 1)
            return
        if os.path.isdir(host):
            host = os.path.join(host, name)
        elif host.endswith("/"):  # a directory was meant, and there is none (as cp says)
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), host)
        shown = host  # the user's name, for messages
        # like cp: through a symlink to its target, and into a device or a fifo, which is
        # written to, never replaced (as root, `get F /dev/null` would replace /dev/null)
        host = os.path.realpath(host)
        if os.path.exists(host) and not stat.S_ISREG(os.stat(host).st_mode):
            # unbuffered: a device's error (/dev/full) comes from the write, named here,
            # not again from close, unnamed
            with open(host, "wb", buffering=0) as file:
                for data in self.transport.get(args[0]):
                    view = memoryview(data)
                    try:
                        while view:
                            view = view[file.write(view):]
                    except OSError as exc:
                        exc.filename = shown
                        raise
            self.status = 0
            return
        directory = os.path.dirname(host)
        try:
            fd, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(host)}.", dir=directory)
        except OSError as exc:
            exc.filename = shown  # not the temporary one
            raise
        try:
            # the mode a plain write would give: the old file's, or 0666 less the umask
            try:
                mode = stat.S_IMODE(os.stat(host).st_mode)
            except OSError:
                mode = 0o666 & ~_umask()
            os.fchmod(fd, mode)
            with os.fdopen(fd, "wb") as file:
                for data in self.transport.get(args[0]):
                    file.write(data)
            os.replace(temporary, host)
        except BaseException as exc:
            os.unlink(temporary)
            if isinstance(exc, OSError) and exc.filename in (None, temporary):
                # (a full disk fails a buffered write, or its close, unnamed)
                exc.filename, exc.filename2 = shown, None
            raise
        if self.interactive:
            self.stdout.write(f"{args[0]} -> {shown}\n")
        self.status = 0

    def _local_multirepl(self, args, command) -> None:
        """Read ``--data HOSTFILE`` here (tile 0 cannot), then start the repl on tile 0.
        Only as much is read as the chosen tiles' SRAM could ever hold, and one byte
        more, to tell that there is more: the file may be endless (/dev/zero, a FIFO)."""
        word = _multirepl_data_word(command)
        host = self._host_file("multirepl", word, "--data")
        if host is None:
            return
        tiles = self._chosen_tiles(command)
        if tiles is None:  # (a bad --tiles: tile 0 says what is wrong with it, before any data)
            self._execute(command.text)
            return
        room = len(tiles) * self.sram_per_tile
        # (a whole chip's SRAM is ~900 MiB, more than one request carries: read no more)
        limit = room if self.max_payload is None else min(room, self.max_payload)
        with open(host, "rb") as file:
            data = read_at_most(file, limit)
            if len(data) > limit:
                info = os.fstat(file.fileno())
                amount = f"{info.st_size} bytes is" if stat.S_ISREG(info.st_mode) else "gives"
                if limit < room:
                    self._fail("multirepl", f"{host}: {amount} more than one request to the machine carries "
                                            f"({limit} bytes); give less data")
                    return
                if len(tiles) == 1:
                    which, sram = f"tile {format_tiles(tiles)}", f"{room} bytes of SRAM"
                else:
                    which = f"tiles {format_tiles(tiles)}"
                    sram = f"{room} bytes: {self.sram_per_tile} bytes of SRAM each"
                self._fail("multirepl", f"{host}: {amount} more than {which} can hold ({sram}, some of it "
                                        "in use); give less data, or more tiles (--tiles)")
                return
        self._execute(command.text, payload=data)

    def _chosen_tiles(self, command) -> list[int] | None:
        """The tiles ``multirepl --tiles`` chooses on this machine (None: a bad spec)."""
        try:
            opts, _ = multirepl_options([word.text for word in command.words[1:]])
            return parse_tiles(opts.get("--tiles", "all"), self.machine_tiles)
        except (Usage, TileSpecError):
            return None


class _PromptEnded(Exception):
    """Ends the prompt from outside it: the session has gone (the machine halted), or a
    termination signal came."""


def _end_prompt(session: PromptSession | None) -> None:
    """End the prompt showing now, if any, putting the terminal back (from any thread, or
    a signal handler; a prompt that starts later ends at once through its ``pre_run``)."""
    if session is None:
        return
    app = session.app
    loop = app.loop
    if loop is None or loop.is_closed():
        return

    def end() -> None:
        if app.is_running and not app.future.done():
            app.exit(exception=_PromptEnded())

    loop.call_soon_threadsafe(end)


def _umask() -> int:
    """The process's umask (reading it means setting it: set it straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _is_local(command) -> bool:
    spec = COMMANDS.get(command.name)
    if spec is not None and spec.terminal:
        return True
    return command.name == "multirepl" and _multirepl_data_word(command) is not None


def _multirepl_data_word(command) -> Word | None:
    """The word of ``multirepl --data`` that names the host file, its options read as
    tile 0 reads them (None: no --data, or options tile 0 refuses, saying why)."""
    words = command.words[1:]
    sources: dict = {}
    try:
        opts, _ = multirepl_options([word.text for word in words], sources)
    except Usage:
        return None
    if "--data" not in opts:
        return None
    index, start = sources["--data"]
    word = words[index]
    if not start:
        return word
    # --data=NAME: the end of the word (the option's name has no glob characters, so the
    # word's pattern starts with it as the text does)
    return Word(word.text[start:], word.pattern[start:] if word.pattern is not None else None)


def _host_listdir(directory: str) -> list[tuple[str, bool]]:
    with os.scandir(os.path.expanduser(directory)) as entries:
        return [(entry.name, entry.is_dir()) for entry in entries]


def _complete_now(buffer, completer: Completer) -> None:
    """Tab, as prompt_toolkit's own binding does it (the part every completion shares is
    inserted; several left open a menu, which Tab then moves through), but before the next
    key is handled. prompt_toolkit completes in a task that runs after every key already
    typed: Enter typed right after Tab ran the line as it was, while the screen showed it
    completed, and letters typed after Tab went onto the uncompleted word. Keys typed while
    tile 0 answers wait in the terminal, as they do in readline."""
    if buffer.complete_state:
        buffer.complete_next()
        return
    document = buffer.document
    completions = list(completer.get_completions(document, CompleteEvent(completion_requested=True)))
    before = document.text_before_cursor
    if len(completions) == 1 and before[len(before) + completions[0].start_position:] == completions[0].text:
        return  # (one completion, which adds nothing)
    if not completions:
        return
    common = get_common_complete_suffix(document, completions)
    if common:
        buffer.insert_text(common)
        if len(completions) == 1:
            return
        completions = [completion.new_completion_from_position(len(common)) for completion in completions]
    buffer.complete_state = CompletionState(original_document=buffer.document, completions=completions)
    buffer.on_completions_changed.fire()
    if len(completions) == 1 and not common:  # (one that replaces what was typed: taken)
        buffer.go_to_completion(0)


class _TileCompleter(Completer):
    """Completions asked of tile 0 (commands, then chip paths; Python names in the repl
    modes); host paths for ``put`` and ``get`` completed here."""

    def __init__(self, terminal: Terminal):
        self.terminal = terminal

    def get_completions(self, document, complete_event):
        text = document.text_before_cursor
        host = host_word(text) if self.terminal.mode == SHELL else None
        if host is not None:
            start, words = host[0], complete_host_path(host[1], _host_listdir)
        else:
            try:
                start, words = self.terminal.transport.complete(text)
            except (RemoteError, OSError):
                return
        for word in words:
            yield Completion(word, start_position=start - len(text))
