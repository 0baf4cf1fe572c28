"""The ``rallypoint`` command line.

The root command knows no subcommand of its own: every subcommand (``plugins``, ``config`` and
those of other packages) is a :class:`~rallypoint.core.records.CliCommand` registered through the
``rallypoint_cli_commands`` hook and imported only when used. A subcommand whose package is not
installed is simply absent.

Errors end the process with a message, never a traceback: exit code 2 for usage and
configuration errors, 1 for failures. ``RALLYPOINT_DEBUG=1`` adds the traceback of an
unexpected error.
"""

from __future__ import annotations

import os
import sys
import traceback
import warnings
from typing import Any

import click

from rallypoint.core.errors import EXIT_FAILURE, EXIT_USAGE, RallypointError

__all__ = ["cli", "main", "plugin_manager"]

_DEBUG_ENV = "RALLYPOINT_DEBUG"


def plugin_manager(ctx: click.Context | None = None) -> Any:
    """The plugin manager of the current command line invocation (built once, on first use)."""
    from rallypoint.core.plugins import get_plugin_manager

    ctx = ctx or click.get_current_context()
    root = ctx.find_root()
    if not isinstance(root.obj, dict):
        root.obj = {}
    if "pm" not in root.obj:
        root.obj["pm"] = get_plugin_manager()
    return root.obj["pm"]


class PluginGroup(click.Group):
    """A click group whose subcommands come from the ``rallypoint_cli_commands`` hook."""

    def _records(self, ctx: click.Context) -> dict[str, Any]:
        from rallypoint.core.builtin import CLI_COMMANDS

        registry = plugin_manager(ctx).registry(CLI_COMMANDS)
        out = {}
        for record in registry:
            for name in record.names:
                out[name] = record
        return out

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(r.name for r in {id(r): r for r in self._records(ctx).values()}.values())

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        record = self._records(ctx).get(cmd_name)
        if record is None:
            return None
        command: click.Command = record.load()
        if not command.short_help and record.summary:
            command.short_help = record.summary
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Show summaries from the records so that --help imports no subcommand module.
        rows = [(r.name, r.summary) for r in {id(r): r for r in self._records(ctx).values()}.values()]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(sorted(rows))

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            from rallypoint.core.errors import did_you_mean

            guess = did_you_mean(name, self.list_commands(ctx))
            hint = f" Did you mean {guess!r}?" if guess else ""
            available = ", ".join(self.list_commands(ctx))
            raise click.UsageError(
                f"no such command {name!r}.{hint} Available: {available}. "
                "Commands come from installed packages; see rallypoint plugins list.",
                ctx,
            )
        return super().resolve_command(ctx, args)


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from rallypoint.core.plugins import installed_plugins, rallypoint_distributions

    found = rallypoint_distributions()  # core first, then every other rallypoint distribution
    click.echo(f"rallypoint {found[0][1] or 'unknown'}")
    for distribution, version in found:
        click.echo(f"  {distribution} {version or 'unknown'}")
    plugins = installed_plugins()
    if plugins:
        click.echo("plugins:")
    for name, dist, dist_version in plugins:
        click.echo(f"  {name} ({dist or 'unknown distribution'} {dist_version or ''})".replace(" )", ")"))
    ctx.exit(0)


@click.group(cls=PluginGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show every installed rallypoint distribution and plugin with its version, and exit.",
)
def cli() -> None:
    """rallypoint: launch and coordinate distributed PyTorch training.

    Every layer is a plugin, and so is every subcommand below: installed packages declare the
    kinds of plugins, the job-file sections and the commands. See `rallypoint plugins list`.

    \b
    Environment:
      RALLYPOINT_<SECTION>_<KEY>=VALUE    override <section>.<key> of the job file
      RALLYPOINT_DISABLE_PLUGINS=a,b      never load these plugins
      RALLYPOINT_DISABLE_PLUGIN_AUTOLOAD  load essential packages only, no other plugins
      RALLYPOINT_DEBUG=1                  show tracebacks of unexpected errors
    """


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    from rallypoint.core.plugins import PluginLoadWarning

    if issubclass(category, PluginLoadWarning):
        click.echo(f"{_red('warning:', yellow=True)} {message}", err=True)
    else:
        click.echo(warnings.formatwarning(message, category, filename, lineno, line), err=True, nl=False)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code (the ``rallypoint`` console script)."""
    warnings.showwarning = _show_warning
    try:
        result = cli.main(args=argv, prog_name="rallypoint", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return EXIT_USAGE if isinstance(exc, click.UsageError) else exc.exit_code
    except RallypointError as exc:
        click.echo(f"{_red('error:')} {exc}", err=True)
        return exc.exit_code
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 130
    except OSError as exc:
        if exc.filename is None:  # not about a path: treated as unexpected
            return _internal_error(exc)
        if os.environ.get(_DEBUG_ENV):
            traceback.print_exc()
        click.echo(f"{_red('error:')} {_os_error(exc)}", err=True)
        return EXIT_FAILURE
    except Exception as exc:  # noqa: BLE001 - never a bare traceback
        return _internal_error(exc)
    return result if isinstance(result, int) else 0


def _red(text: str, *, yellow: bool = False) -> str:
    """``text`` in red (or yellow) when stderr is a terminal and ``NO_COLOR`` is unset (or empty)."""
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb" or not sys.stderr.isatty():
        return text
    return click.style(text, fg="yellow" if yellow else "red", bold=True)


def _os_error(exc: OSError) -> str:
    """An operating-system error about a path, in words: the path, the reason, what to check."""
    paths = " -> ".join(str(p) for p in (exc.filename, exc.filename2) if p is not None)
    return (
        f"{paths}: {exc.strerror or exc}. The system refused a file operation: check that the path is "
        f"right, that this user may write there and that the disk has space ({_DEBUG_ENV}=1 shows where)"
    )


def _internal_error(exc: BaseException) -> int:
    if os.environ.get(_DEBUG_ENV):
        traceback.print_exception(exc)
    click.echo(
        f"internal error: {type(exc).__name__}: {exc}\n"
        f"This is a bug in rallypoint or a plugin. Rerun with {_DEBUG_ENV}=1 for the traceback, "
        "and report it with that output.",
        err=True,
    )
    return EXIT_FAILURE


def entrypoint() -> None:
    """Console-script entry point."""
    sys.exit(main())
