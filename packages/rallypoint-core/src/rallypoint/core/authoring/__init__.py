"""Tools for plugin authors: ``rallypoint plugin new`` and ``rallypoint plugin check``.

:func:`~rallypoint.core.authoring.generate.generate_plugin` writes a complete third-party
distribution of one kind (:func:`~rallypoint.core.authoring.kinds.installed_kinds`);
:func:`~rallypoint.core.authoring.check.check_distribution` checks an installed one against the
hook specifications. :func:`~rallypoint.core.authoring.specs.check_hookspec` holds a hook
specification to the documentation rules every lifecycle and decision hook follows.

Nothing here is imported by the ``rallypoint`` command unless one of these subcommands runs.

Core names no subsystem here either: each package that accepts a kind of plugin declares it
(``rallypoint_plugin_templates``) and ships that kind's templates; core holds the common files
and its own kind, ``cli-command``. The checker and the hook-spec rules work on whatever is
installed.
"""
