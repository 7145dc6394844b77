"""Per pod class: the options whose template it may use, how many of its pods fit an empty node of each, and its
reference cost (the cheapest stand-alone $/h per pod)."""

from __future__ import annotations

import numpy as np

from gpuscale.core.memo import Memo
from gpuscale.core.planner.classes import PodClass, referenced_keys
from gpuscale.core.planner.options import Option, solo_count
from gpuscale.core.predicates import static_failure
from gpuscale.core.state import IntArray

_Hosts = tuple[float, float] | None

_CLASS_OPTIONS: Memo[tuple[list[int], list[int], float, _Hosts]] = Memo(4096)
"""Per (class key, option table), the same for every plan: the indices of the options the class may use, how many of
its pods fit an empty node of each, its reference cost (see :meth:`ClassOptions.ref_cost`) and
:meth:`ClassOptions.hosts`."""


_Columns = tuple[IntArray, IntArray, IntArray, IntArray, list[str | None]]

_COLUMNS: Memo[_Columns] = Memo(256)
"""Per option table: its allocatable cpu, memory, GPUs and pods and its GPU models, as columns (read-only)."""


def _columns(table: tuple[Option, ...]) -> _Columns:
    oa = [o.alloc for o in table]
    cols = [np.array([getattr(a, f) for a in oa], dtype=np.int64) for f in ("cpu_milli", "memory_mib", "gpus", "pods")]
    for c in cols:
        c.flags.writeable = False  # shared by every plan on this table
    return (cols[0], cols[1], cols[2], cols[3], [o.itype.gpu_model for o in table])


class ClassOptions:
    """The option table of one planning run and, per class index, the options the class may use (cached)."""

    def __init__(self, table: tuple[Option, ...]) -> None:
        self._table = table
        self.options = list(table)
        self._opt_groups_cache: dict[tuple[str, ...], list[IntArray]] = {}
        self.opt_cpu, self.opt_mem, self.opt_gpus, self.opt_pods, self.opt_models = _COLUMNS.get(
            lambda: _columns(table), objects=(table,)
        )
        self._class_opts: dict[int, tuple[list[Option], list[int], float, _Hosts]] = {}
        """Per class index: its feasible options, pods per empty node of each, reference cost, hosts."""

    def feasible(self, cls: PodClass) -> list[Option]:
        """Options whose template passes the class's predicates and holds one pod (available or not)."""
        return self._options_of(cls)[0]

    def _options_of(self, cls: PodClass) -> tuple[list[Option], list[int], float, _Hosts]:
        got = self._class_opts.get(cls.index)
        if got is None:
            indices, solos, ref, hosts = _CLASS_OPTIONS.get(
                lambda: self._class_options(cls), cls.key, objects=(self._table,)
            )
            got = self._class_opts[cls.index] = ([self.options[i] for i in indices], solos, ref, hosts)
        return got

    def _class_options(self, cls: PodClass) -> tuple[list[int], list[int], float, _Hosts]:
        """(:meth:`_feasible_indices`, pods per empty node of each, reference cost, hosts) of a class."""
        indices = self._feasible_indices(cls)
        solos = [solo_count(self.options[i], cls.request) for i in indices]
        costs = [
            self.options[i].price / n
            for i, n in zip(indices, solos, strict=True)
            if self.options[i].unavailable_until is None
        ]
        hosts = [
            (self.options[i].price, self.options[i].price / n)
            for i, n in zip(indices, solos, strict=True)
            if self.options[i].unavailable_until is None and n > 0
        ]
        bounds = (min(p for p, _ in hosts), min(r for _, r in hosts)) if hosts else None
        return indices, solos, min(costs) if costs else 0.0, bounds

    def _feasible_indices(self, cls: PodClass) -> list[int]:
        """Indices into the option table of the options :meth:`feasible` returns."""
        pod, r = cls.example, cls.request
        fit = (self.opt_cpu >= r.cpu_milli) & (self.opt_mem >= r.memory_mib) & (self.opt_pods >= 1)
        if r.gpus:
            fit &= self.opt_gpus >= r.gpus
        elif r.gpu_milli:
            fit &= self.opt_gpus >= 1
        if r.wants_gpu and r.gpu_models is not None:
            fit &= np.array([m in r.gpu_models for m in self.opt_models], dtype=bool)
        ok = np.zeros(len(self.options), dtype=bool)
        for rows in self._option_groups(referenced_keys(pod)):
            rows = rows[fit[rows]]
            if rows.size:
                o = self.options[int(rows[0])]
                if static_failure(pod, o.labels, o.taints) is None:
                    ok[rows] = True
        return ok.nonzero()[0].tolist()  # Python ints, as int() of each of np.flatnonzero(ok)

    def _option_groups(self, keys: tuple[str, ...]) -> list[IntArray]:
        """Options grouped by their template labels on ``keys`` and taints (cached per key set)."""
        got = self._opt_groups_cache.get(keys)
        if got is None:
            groups: dict[tuple[object, ...], list[int]] = {}
            for o in self.options:
                groups.setdefault((tuple(o.labels.get(k) for k in keys), o.taints), []).append(o.index)
            got = [np.array(v, dtype=np.int64) for v in groups.values()]
            self._opt_groups_cache[keys] = got
        return got

    def solo(self, cls: PodClass) -> list[int]:
        """Pods of the class that fit an empty node, per feasible option (cached)."""
        return self._options_of(cls)[1]

    def ref_cost(self, cls: PodClass) -> float:
        """The cheapest stand-alone $/h per pod of the class (its value when packed)."""
        return self._options_of(cls)[2]

    def hosts(self, cls: PodClass) -> tuple[float, float] | None:
        """Over the options available now that hold a pod of the class: (the least price, the least price per pod
        of an empty node); None without such options."""
        return self._options_of(cls)[3]
