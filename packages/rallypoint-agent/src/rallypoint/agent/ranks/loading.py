"""Loading a strategy from its record, and running it: :func:`load_strategy`, :func:`compute_assignment`.

Strategy options are validated once, by the job's config resolution
(:func:`rallypoint.core.config.resolve_config` validates ``[ranks.options]`` with the record's
``options_model`` into the selection's ``options``). Here they are handed to the strategy as
given.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rallypoint.agent.ranks.model import RankAssignment, RankAssignmentError, RankNode
from rallypoint.agent.ranks.strategy import RankStrategy
from rallypoint.agent.ranks.validation import check_nodes, validate_assignment
from rallypoint.agent.records import RANK_STRATEGIES, RankStrategyRecord
from rallypoint.core.errors import PluginError, RallypointError

if TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = ["compute_assignment", "load_strategy"]


class _FunctionStrategy:
    """Adapts a plain function ``(nodes, options) -> RankAssignment`` to :class:`RankStrategy`."""

    def __init__(self, function: Callable[[Sequence[RankNode], Any], RankAssignment], name: str) -> None:
        self.function = function
        self.name = name

    def assign(self, nodes: Sequence[RankNode], options: Any) -> RankAssignment:
        return self.function(nodes, options)

    def __repr__(self) -> str:
        return f"_FunctionStrategy({self.function!r})"


def load_strategy(record: RankStrategyRecord) -> RankStrategy:
    """Import the strategy a record names and return it as a :class:`RankStrategy`.

    The factory may be a class (instantiated without arguments), an object with ``assign``, or
    a plain function ``(nodes, options) -> RankAssignment``.

    Raises:
        MissingDependencyError: a requirement of the record is not installed.
        PluginError: the factory cannot be imported or is none of the above.

    Examples:
        >>> record = RankStrategyRecord(name="default", factory="rallypoint.agent.ranks:DefaultStrategy")
        >>> type(load_strategy(record)).__name__
        'DefaultStrategy'
    """
    record.check_requirements(RANK_STRATEGIES.label)
    obj = record.load()
    if inspect.isclass(obj):
        try:
            obj = obj()
        except Exception as exc:
            raise PluginError(
                f"rank strategy {record.name!r}: cannot create {record.factory!r}: {type(exc).__name__}: {exc}"
            ) from exc
    if callable(getattr(obj, "assign", None)):
        return obj  # type: ignore[no-any-return]
    if callable(obj):
        return _FunctionStrategy(obj, record.name)
    raise PluginError(
        f"rank strategy {record.name!r}: {record.factory!r} is neither a class, an object with an "
        f"'assign' method, nor a function (nodes, options) -> RankAssignment"
    )


def _check_options(record: RankStrategyRecord, options: object) -> None:
    """Refuse a raw ``[ranks.options]`` table: options arrive validated, once, from config resolution."""
    if isinstance(options, Mapping):
        model = record.options_model.__name__ if record.options_model is not None else "None (no options)"
        raise TypeError(
            f"rank strategy {record.name!r}: options must be the validated [ranks.options] ({model}), not a "
            f"raw {type(options).__name__}; pass the options of the job's resolved ranks.strategy selection "
            f"(rallypoint.core.config.resolve_config), or build the model yourself"
        )


def compute_assignment(
    record_or_strategy: RankStrategyRecord | RankStrategy,
    nodes: Sequence[RankNode],
    options: BaseModel | None = None,
    *,
    name: str | None = None,
) -> RankAssignment:
    """Load (if given a record), run and validate a rank strategy.

    Args:
        record_or_strategy: a registered :class:`RankStrategyRecord`, or a strategy object.
        nodes: every participant of the round, in any order.
        options: the validated ``[ranks.options]``, handed to the strategy as given: the
            selection's ``options`` from the job's config resolution (an instance of the
            record's ``options_model``), or ``None`` for a strategy without options.
        name: the strategy's name in messages; default: the record's name, the strategy's
            ``name`` attribute, or its class name.

    Returns:
        The validated assignment.

    Raises:
        RankAssignmentError: the strategy raised, or returned an invalid assignment.
        PluginError: the strategy cannot be loaded.
        TypeError: a record is given with a raw options mapping instead of validated options.
        ValueError: ``nodes`` are inconsistent (see :func:`check_nodes`).

    Examples:
        >>> nodes = [RankNode(node_id="b", group_rank=1, host="b", local_world_size=1),
        ...          RankNode(node_id="a", group_rank=0, host="a", local_world_size=1)]
        >>> record = RankStrategyRecord(name="default", factory="rallypoint.agent.ranks:DefaultStrategy")
        >>> [(w.node_id, w.rank) for w in compute_assignment(record, nodes)]
        [('a', 0), ('b', 1)]
    """
    check_nodes(nodes)
    if isinstance(record_or_strategy, RankStrategyRecord):
        _check_options(record_or_strategy, options)
        strategy_name = name or record_or_strategy.name
        strategy = load_strategy(record_or_strategy)
    else:
        strategy = record_or_strategy
        strategy_name = name or getattr(strategy, "name", None) or type(strategy).__name__
    try:
        assignment = strategy.assign(tuple(nodes), options)
    except RallypointError:
        raise
    except Exception as exc:
        raise RankAssignmentError(strategy_name, f"{type(exc).__name__}: {exc}", raised=True) from exc
    validate_assignment(assignment, nodes, strategy_name)
    return assignment
