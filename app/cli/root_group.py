"""The `tickwheel` command's root group (`TickwheelGroup`): how every command's end is
said, one line on stderr with its exit code (`app.cli.common`), click's usage errors and
the command's own alike, and no traceback (the one of a bug logged at DEBUG)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import Any

import typer
from typer.core import TyperGroup

from app.cli.common import CONFIG_ERROR, FAILED, fail, not_utf8, reader_gone
from app.cli.text import error_line, given_values
from app.errors import ConfigError, TickwheelError

__all__ = ["TickwheelGroup"]

logger = logging.getLogger("tickwheel")


class TickwheelGroup(TyperGroup):
    """The root group: every error one line on stderr with its exit code (click's usage
    errors too, without their usage text), and no traceback; stdout's reader gone, no
    word and `READER_GONE`."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(
                args, prog_name, complete_var, standalone_mode, windows_expand_args, **extra
            )
        try:
            self._standalone(args, prog_name, complete_var, windows_expand_args, **extra)
        except SystemExit as done:
            if done.code == 1 and isinstance(done.__context__, BrokenPipeError):
                # Click's (the help) or rich's (a console's) own end for it: exit 1.
                reader_gone()
            try:
                # Said here, not as "Exception ignored" at the interpreter's exit.
                sys.stdout.flush()
            except BrokenPipeError:
                reader_gone()
            raise
        except BrokenPipeError:
            reader_gone()

    def _standalone(
        self,
        args: Sequence[str] | None,
        prog_name: str | None,
        complete_var: str | None,
        windows_expand_args: bool,
        **extra: Any,
    ) -> None:
        """`main` as a command line runs it: ends with `sys.exit` and the exit code."""
        given = sys.argv[1:] if args is None else list(args)
        if (where := not_utf8(given)) is not None:
            # Bytes that are not UTF-8 (Python holds them as lone surrogates) fit no record,
            # request id or JSON body: each use failed later, naming nothing.
            typer.echo(error_line(f"{where} is not valid UTF-8 text"), err=True)
            sys.exit(CONFIG_ERROR)
        with given_values(given):  # what an error repeats of them, a long one cut
            try:
                code = super().main(
                    args, prog_name, complete_var, False, windows_expand_args, **extra
                )
            except typer.TyperException as exc:  # click's: a usage error, a bad parameter
                if type(exc).__name__ == "NoArgsIsHelpError":  # the help, shown: nothing wrong
                    if exc.format_message():
                        typer.echo(exc.format_message(), err=True)
                    sys.exit(exc.exit_code)
                hint = ""
                ctx = getattr(exc, "ctx", None)
                if ctx is not None:
                    hint = f" (see '{ctx.command_path} --help')"
                typer.echo(error_line(f"{exc.format_message().rstrip('.')}{hint}"), err=True)
                sys.exit(exc.exit_code)
            except typer.Abort:
                typer.echo(error_line("aborted"), err=True)
                sys.exit(FAILED)
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            reader_gone()
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise
        except ConfigError as exc:  # a value the command cannot take, as a bad option
            raise fail(str(exc), CONFIG_ERROR) from exc
        except TickwheelError as exc:
            raise fail(str(exc)) from exc
        except Exception as exc:
            # A bug or the machine's (a data directory not writable): one line, and the
            # traceback for whoever runs at DEBUG.
            logger.debug("the command failed", exc_info=True)
            raise fail(f"unexpected {type(exc).__name__}: {exc}") from exc
