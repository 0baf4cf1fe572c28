"""``rallypoint plugin new`` and ``rallypoint plugin check``: tools for plugin authors."""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["plugin"]


class _InstalledKinds(click.Choice):  # type: ignore[type-arg]
    """The kinds the installed packages declare, looked up once per command line (not at start-up).

    Kept in the click context of the invocation, not on the type: the next invocation in the
    same process (a test, an embedding program) sees what is installed then.
    """

    def __init__(self) -> None:
        super().__init__(())

    @property
    def choices(self) -> tuple[str, ...]:
        ctx = click.get_current_context(silent=True)
        names: tuple[str, ...] | None = None if ctx is None else ctx.meta.get(_META_KEY)
        if names is None:
            from rallypoint.core.authoring.kinds import installed_kinds
            from rallypoint.core.plugins import get_plugin_manager

            names = tuple(k.name for k in installed_kinds(get_plugin_manager()))
            if ctx is not None:
                ctx.meta[_META_KEY] = names
        return names

    @choices.setter
    def choices(self, value: object) -> None:  # click's __init__ assigns; the installed kinds win
        pass


_META_KEY = "rallypoint.core.authoring.kinds"


@click.group()
def plugin() -> None:
    """Write a new plugin distribution, or check an installed one."""


@plugin.command(name="new")
@click.argument("kind", type=_InstalledKinds())
@click.argument("name")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(),
    show_default=True,
    help="Where to create the distribution's directory, rallypoint-NAME.",
)
@click.option("--force", is_flag=True, help="Overwrite the files of an existing directory.")
def new(kind: str, name: str, directory: Path, force: bool) -> None:
    """Write a third-party plugin distribution rallypoint-NAME of KIND.

    KIND is one of the kinds the installed packages declare: a kind is offered when the
    package that accepts such plugins is installed.

    \b
    It holds a pyproject.toml with the entry point, a typed implementation that works, tests
    (the conformance kit where one exists, and a job run with `rallypoint run`) and a README.
    Then:
      pip install -e "DIR/rallypoint-NAME[testing]"
      rallypoint plugin check rallypoint-NAME
      python -m pytest DIR/rallypoint-NAME/tests
    """
    from rallypoint.core.authoring.generate import generate_plugin

    made = generate_plugin(kind, name, directory, force=force)
    click.echo(f"wrote {made.distribution} ({made.kind.name}) in {made.root}:")
    for path in made.files:
        click.echo(f"  {path}")
    click.echo(f'next: pip install -e "{made.root}[testing]" && python -m pytest {made.root / "tests"}')


@plugin.command(name="check")
@click.argument("distribution")
def check(distribution: str) -> None:
    """Load DISTRIBUTION's plugin and check it against the installed hook specifications.

    Reports unknown hook names and arguments, record types, import paths, options models and
    heavy imports (torch, grpc, etcd) of its hook module; prints what it registers. Exit code 1
    when a problem is found.
    """
    from rallypoint.core.authoring.check import check_distribution

    report = check_distribution(distribution)
    click.echo(f"{report.distribution} {report.version}")
    for name, module in report.plugins:
        click.echo(f"  plugin {name} ({module}): hooks {', '.join(report.hooks.get(name, [])) or 'none'}")
    for line in report.registers:
        click.echo(f"  {line}")
    for note in report.notes:
        click.echo(f"note: {note}")
    if report.ok:
        click.echo("ok: the hooks fit their specifications, and the hook modules import nothing heavy")
        return
    for problem in report.problems:
        click.echo(f"problem: {problem}", err=True)
    raise click.exceptions.Exit(1)
