"""Making groups of a communicator: ``split`` (every rank calls), ``subgroup`` (only the
members call, as torch.distributed calls a backend), and the one way both build a child.

A child shares its parent's channels (no new sockets or segments; one progress engine),
carries its own message id in every tag (so that calls on different communicators never
match each other's messages), and is finalized with its parent. The ids come from one
counter per communicator tree in the store, drawn by a group's first member and read back by
the others, so that two groups never share one while both live (ids wrap after 4095 groups:
``tags.COMM_BITS``).
"""
from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

import numpy as np

from rendezvous import PrefixStore, Store

from ..errors import InvalidArgument, PycollError
from ..tags import COMM_BITS

if TYPE_CHECKING:
    from ..runtime.execution import Execution


class _Child(Protocol):
    @property
    def closed(self) -> bool: ...


#: the communicator class (a type parameter: this module does not import it)
Communicator = TypeVar("Communicator", bound=_Child)


def wrap_id(n: int) -> int:
    """Group ids run 1 .. 2**12 - 1 in message tags (0 is the root's; ``tags.COMM_BITS``)."""
    return 1 + (n - 1) % ((1 << COMM_BITS) - 1)


class GroupMaker(Generic[Communicator]):
    """The groups one communicator has made, and how it makes them. It is given what it
    needs: the communicator's rank, size, name and store, the name of its tree's root (whose
    counter hands out ids), its execution (closed or failed: no more groups), its rank check
    and its ``make_child(members, name, comm_id, limit)`` (the communicator of ``members``
    over the parent's channels)."""

    def __init__(self, rank: int, size: int, name: str, store: Store | None, root_name: str,
                 execution: Execution, check_rank: Callable[[int, str, str], int],
                 make_child: Callable[[Sequence[int], str, int, float], Communicator]) -> None:
        self.rank, self.size, self.name = rank, size, name
        self.store = store
        self.root_name = root_name
        self.execution = execution
        self.check_rank = check_rank
        self.make_child = make_child
        self.made = 0                        # splits so far (the same count on every rank)
        self.names: set[str] = set()
        #: subgroup name -> (its generation, the latest communicator of that name)
        self.subgroups: dict[str, tuple[int, Communicator]] = {}
        #: (subgroup name, its members) -> the latest generation made
        self.generations: dict[tuple[str, tuple[int, ...]], int] = {}
        #: the live children, finalized with the parent
        self.children: list[Communicator] = []

    def split(self, color: int | None, key: int, name: str | None,
              limit: float) -> Communicator | None:
        """``Communicator.split``: every rank publishes (color, key), reads everyone's, and
        the ranks of its color, ordered by key then rank, make the child."""
        for value, what in ((color, "color"), (key, "key")):
            if value is not None and (isinstance(value, bool)
                                      or not isinstance(value, (int, np.integer))):
                raise InvalidArgument(f"rank {self.rank}: split: {what} must be an int "
                                      f"(or None for color), not {value!r}")
        self.made += 1
        n = self.made
        name = f"split{n}" if name is None else str(name)
        if name in self.names:
            raise InvalidArgument(f"rank {self.rank}: split: communicator {self.name} already "
                                  f"made a group named {name!r}; group names must be unique")
        self.names.add(name)
        scoped = self._scoped()
        if scoped is None:
            records = [{"color": color, "key": key}]
        else:
            scoped.set(f"group/{n}/{self.rank}",
                       json.dumps({"color": None if color is None else int(color),
                                   "key": int(key)}))
            raw = scoped.multi_get([f"group/{n}/{r}" for r in range(self.size)],
                                   timeout=limit)
            records = [json.loads(v) for v in raw]
        if color is None or color < 0:
            return None
        members = sorted((r for r, rec in enumerate(records) if rec["color"] == color),
                         key=lambda r: (records[r]["key"], r))
        comm_id = (wrap_id(n) if scoped is None
                   else self._agree_id(scoped, f"group/{n}/{int(color)}/id",
                                       self.rank == members[0], limit))
        return self._child(members, f"{self.name}.{name}.{color}", comm_id, limit)

    def subgroup(self, ranks: Sequence[int], name: str, limit: float) -> Communicator:
        """``Communicator.subgroup``: the members agree on the id under a key made from
        ``name``; nobody else takes part."""
        where = f"rank {self.rank}: subgroup {name!r} of communicator {self.name}"
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"{where}: name must be a non-empty string, the same on "
                                  "every member")
        members = [self.check_rank(r, "ranks", "subgroup") for r in ranks]
        if len(set(members)) != len(members):
            raise InvalidArgument(f"{where}: ranks {members} has duplicates")
        if self.rank not in members:
            raise InvalidArgument(f"{where}: this rank is not in ranks {members}; only the "
                                  "members call subgroup (use split or new_group to have "
                                  "every rank call)")
        earlier = self.subgroups.get(name)
        if earlier is not None and not earlier[1].closed:
            raise InvalidArgument(f"{where}: a live subgroup of that name exists already; "
                                  "names must be unique (finalize the old one first)")
        if self.execution.closed or self.execution.failed is not None:
            raise PycollError(f"{where}: the communicator is finalized or failed "
                              f"({self.execution.failed or 'finalized'}); create a new one")
        # a name may come back once its group is finalized (torch's hashed names do), with
        # the same members or others: the members of one group count its generations alike
        # (per name and member list: a rank that never was in the old group must not read
        # its keys), and keys and ids are per generation
        ident = (name, tuple(members))
        generation = self.generations.get(ident, -1) + 1
        self.generations[ident] = generation
        label = f"{name}@{zlib.crc32(repr(members).encode()):08x}"
        label += f"#{generation}" if generation else ""
        scoped = self._scoped()
        comm_id = (wrap_id(1 + len(self.subgroups)) if scoped is None
                   else self._agree_id(scoped, f"subgroup/{label}/id", self.rank == members[0],
                                       limit))
        child = self._child(members, f"{self.name}:{label}", comm_id, limit)
        self.subgroups[name] = (generation, child)
        return child

    def _scoped(self) -> PrefixStore | None:
        """The parent's keys in the store (None: a world of one, or no store)."""
        if self.size == 1 or self.store is None:
            return None
        return PrefixStore(f"pycoll/{self.name}/", self.store)

    def draw_id(self) -> int:
        """A fresh message id from the tree's counter in the store."""
        assert self.store is not None
        return wrap_id(int(self.store.add(f"pycoll/{self.root_name}/group_ids", 1)))

    def _agree_id(self, scoped: Store, key: str, draws: bool, limit: float) -> int:
        """A group's message id: the member that ``draws`` takes a fresh one from the tree's
        counter and publishes it under ``key``; every member reads it back."""
        if draws and self.store is not None:
            scoped.set(key, str(self.draw_id()))
        return int(scoped.get(key, timeout=limit))

    def _child(self, members: Sequence[int], name: str, comm_id: int,
               limit: float) -> Communicator:
        """The parent's ``make_child``, remembered among the live children."""
        child = self.make_child(members, name, comm_id, limit)
        self.children = [c for c in self.children if not c.closed]
        self.children.append(child)
        return child
