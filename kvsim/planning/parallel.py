"""The parallel layouts `plan --target-rate` searches: tensor parallel x data parallel x expert parallel.

A dense model's layouts are its tensor-parallel degrees (data-parallel ranks of a dense model are
independent replicas, which the search counts anyway). A mixture-of-experts model's are every
tensor-parallel degree asked for, each with data-parallel attention ranks (vLLM's DP + EP: a replica
of tp x dp GPUs, attention per rank, the MoE layers over all of them) up to one node of
`MAX_NODE_GPUS`, with the experts sliced over the replica's GPUs or, from two GPUs on, whole
(`enable_expert_parallel`). A layout is a `Parallel`: an int (the replica's GPUs, so that prices and
GPU counts multiply as for a tensor-parallel degree) that knows its tp, dp and EP, and the
[hardware] keys that set it.
"""

from __future__ import annotations

from kvsim.scenario.catalog import ModelSpec, tp_problem

MAX_NODE_GPUS = 8
DP_DEGREES = (1, 2, 4, 8)


class Parallel(int):
    """GPUs a replica takes (the int), as tp tensor-parallel x dp data-parallel ranks, experts whole (ep)."""

    tp: int
    dp: int
    ep: bool

    def __new__(cls, tp: int, dp: int = 1, ep: bool = False):
        self = super().__new__(cls, tp * dp)
        self.tp, self.dp, self.ep = tp, dp, ep
        return self

    def __reduce__(self):
        return Parallel, (self.tp, self.dp, self.ep)

    def key(self) -> tuple:
        return (self.tp, self.dp, self.ep)

    def __eq__(self, other) -> bool:  # two layouts of as many GPUs are not the same layout
        if isinstance(other, Parallel):
            return self.key() == other.key()
        return self.dp == 1 and not self.ep and self.tp == other

    def __ne__(self, other) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self.tp) if self.dp == 1 and not self.ep else hash(self.key())

    def __str__(self) -> str:
        """'4' for plain tensor parallelism (as a TP degree prints), '1 DP 8 EP' for the rest."""
        return str(self.tp) + (f" DP {self.dp}" if self.dp > 1 else "") + (" EP" if self.ep else "")

    __format__ = lambda self, spec: format(str(self), spec)  # noqa: E731  (labels: f"TP{layout}")

    def hardware(self) -> dict:
        """The [hardware] keys of the layout (only the tensor-parallel degree for plain TP)."""
        out = {"tensor_parallel_size": self.tp}
        if self.dp > 1 or self.ep:
            out.update(data_parallel_size=self.dp, enable_expert_parallel=self.ep)
        return out


def hardware_keys(tp) -> dict:
    """[hardware] keys of a layout: a Parallel's, or a plain tensor-parallel degree's."""
    return tp.hardware() if isinstance(tp, Parallel) else {"tensor_parallel_size": tp}


def candidates(model: ModelSpec, tps) -> list:
    """The layouts to search for `model` at the tensor-parallel degrees `tps` (see the module docstring)."""
    if model.moe is None:
        return list(tps)
    out = []
    for tp in tps:
        if tp_problem(model, tp):
            out.append(tp)  # refused with its reason by the caller
            continue
        for dp in DP_DEGREES:
            if tp * dp > MAX_NODE_GPUS and dp > 1:
                break
            out.append(Parallel(tp, dp, False) if dp > 1 else tp)  # dp > 1: the MoE layers over every GPU
            if tp * dp > 1 and tp * dp <= model.moe.n_routed_experts:
                out.append(Parallel(tp, dp, True))
    return out
