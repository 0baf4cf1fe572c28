"""Tools for plugin authors: ``rallypoint plugin new`` and ``rallypoint plugin check``.

:func:`~rallypoint.core.authoring.generate.generate_plugin` writes a complete third-party
distribution of one kind (:data:`~rallypoint.core.authoring.kinds.KINDS`);
:func:`~rallypoint.core.authoring.check.check_distribution` checks an installed one against the
hook specifications. :func:`~rallypoint.core.authoring.specs.check_hookspec` holds a hook
specification to the documentation rules every lifecycle and decision hook follows.

Nothing here is imported by the ``rallypoint`` command unless one of these subcommands runs.

Core's code names no subsystem; the templates are the exception, as data: they are text files
that name the distributions and kinds a generated plugin depends on (``kinds.py``), and nothing
in core imports them. The checker and the hook-spec rules work on whatever is installed.
"""
