"""`ensemble_map`: run a function written for one chain across a sharded ensemble."""

import collections
import functools
import re
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.extend import core as jex_core
from jax.sharding import PartitionSpec as P

from ._batch_invariant import check_block_size, resolve_block_size
from ._closures import (
    describe_capture,
    is_explicit_sharded,
    jaxpr_constants,
    reachable_arrays,
    substitute,
)
from ._context import EnsembleFrame, current_frame, entered
from ._errors import (
    ChainCountError,
    ClosureError,
    EnsembleError,
    EnsembleTypeError,
    OutputRoleError,
)
from ._jax_private import is_batched_over
from ._mesh import axis_size, place, resolve_mesh
from ._partition import LeafInfo, count_chains, describe, resolve_roles, spec_for
from ._roles import BROADCAST, PER_CHAIN, Role

# Discovery results by call signature, reused while the captured arrays are the same.
_DISCOVERIES: collections.OrderedDict = collections.OrderedDict()
_MAX_DISCOVERIES = 512


class _Discovery(NamedTuple):
    fingerprint: tuple
    captured_ids: tuple[int, ...]
    info: Any
    reuse: "_Reuse"


class _Reuse:
    """The discovery trace's jaxpr, evaluated in the program instead of tracing `fn` again.

    Equal to every other `_Reuse`, so it rides in the jit cache key without being part of
    it: two calls with equal plans compile the same program whichever jaxpr they carry.
    `closed` is None where the jaxpr cannot be reused (an array captured inside a nested
    `jax.jit` callee is a constant there, and would enter the `shard_map` body by closure;
    or a mesh was set with `jax.set_mesh`); the program then traces the rebuilt function.
    `const_slots` and `sharded_slots` give, for each constant and each sharded-capture
    input of the jaxpr, its position among the lifted operands (None: not lifted), and
    `num_batched` how many outputs are per-chain.
    """

    def __init__(
        self,
        closed: Any = None,
        const_slots: tuple[int | None, ...] = (),
        sharded_slots: tuple[int | None, ...] = (),
        num_batched: int = 0,
    ):
        self.closed = closed
        self.const_slots = const_slots
        self.sharded_slots = sharded_slots
        self.num_batched = num_batched

    def __hash__(self) -> int:
        return 0

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, _Reuse)

    def evaluate(self, pcs: list, bcs: list, lifted: list) -> tuple[list, list]:
        consts = [
            c if slot is None else lifted[slot]
            for c, slot in zip(self.closed.consts, self.const_slots)
        ]
        sharded = [
            jnp.zeros(v.aval.shape, v.aval.dtype) if slot is None else lifted[slot]
            for v, slot in zip(self.closed.jaxpr.invars[len(pcs) + len(bcs) :], self.sharded_slots)
        ]
        fn = jex_core.jaxpr_as_fun(jex_core.ClosedJaxpr(self.closed.jaxpr, consts))
        outs = fn(*pcs, *bcs, *sharded)
        return list(outs[: self.num_batched]), list(outs[self.num_batched :])


class _Static:
    """Hashable wrapper for the static (non-array) parts of the inputs."""

    def __init__(self, tree: Any):
        self.leaves, self.treedef = jax.tree.flatten(tree)
        self._hash = hash((self.treedef, tuple(_hashable(x) for x in self.leaves)))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: Any) -> bool:
        return (
            isinstance(other, _Static)
            and self.treedef == other.treedef
            and len(self.leaves) == len(other.leaves)
            and all(_same(a, b) for a, b in zip(self.leaves, other.leaves))
        )

    def tree(self) -> Any:
        return jax.tree.unflatten(self.treedef, self.leaves)


def _hashable(x: Any) -> Any:
    try:
        hash(x)
        return x
    except TypeError:
        return id(x)


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # noqa: BLE001 - objects with odd __eq__ are compared by identity
        return False


class _ArraySlot:
    """Marks where an array leaf goes in a static tree."""

    def __repr__(self) -> str:
        return "<array>"


_ARRAY = _ArraySlot()


class _OutInfo(NamedTuple):
    treedef: Any
    static_leaves: "_Static"  # output leaves, `_ARRAY` where arrays go
    per_chain: tuple[bool, ...]  # for each array output leaf
    lift_per_chain: tuple[bool, ...]  # declared per-chain but computed once: broadcast it


class _Plan(NamedTuple):
    """Everything static about one call, and all the trace reads about it: the jit cache key.

    `captures` names each lifted operand by its position in `reachable_arrays` walk order
    of the static tree (None: not reachable, e.g. made while tracing), a token that is the
    same on every call with the same structure, so new captured arrays of the same shapes
    reuse the compiled program while the trace can still find which objects they replace.
    """

    static: _Static
    in_per_chain: tuple[bool, ...]
    mesh: Any
    mesh_axis: str
    local_axis: str
    num_chains: int
    block_size: int | None
    out: _OutInfo
    out_roles: _Static
    captures: tuple[int | None, ...]
    reuse: _Reuse


def _split_by_role(leaves: list, per_chain: tuple[bool, ...]) -> tuple[list, list]:
    return (
        [x for x, pc in zip(leaves, per_chain) if pc],
        [x for x, pc in zip(leaves, per_chain) if not pc],
    )


def _merge_by_role(pcs: list, bcs: list, per_chain: tuple[bool, ...]) -> list:
    pcs_it, bcs_it = iter(pcs), iter(bcs)
    return [next(pcs_it) if pc else next(bcs_it) for pc in per_chain]


class _Trace:
    """Calls the user function for one chain and sorts its outputs by role."""

    def __init__(self, static_tree: Any, out_roles: Any, local_axis: str):
        self.static_tree = static_tree
        self.out_roles = out_roles
        self.local_axis = local_axis
        self.info: _OutInfo | None = None
        self.unbatched: list = []

    def call(self, array_leaves: list, table: dict[int, Any] | None) -> list:
        treedef_leaves, treedef = jax.tree.flatten(self.static_tree)
        it = iter(array_leaves)
        full = [next(it) if x is _ARRAY else x for x in treedef_leaves]
        fn, args, kwargs = jax.tree.unflatten(treedef, full)
        if table:
            fn, args, kwargs = substitute((fn, args, kwargs), table)
        out = fn(*args, **kwargs)
        return self._sort(out)

    def _sort(self, out: Any) -> list:
        leaves, treedef = jax.tree.flatten(out)
        declared = _declared_output_roles(out, self.out_roles)
        per_chain, lift, batched_out, statics = [], [], [], []
        self.unbatched = []
        d_iter = iter(declared)
        for leaf in leaves:
            if not eqx.is_array(leaf):
                statics.append(leaf)
                continue
            statics.append(_ARRAY)
            info = next(d_iter)
            batched = is_batched_over(leaf, self.local_axis)
            if info.role is BROADCAST and batched:
                raise OutputRoleError(
                    f"{info.path} ({describe(leaf)}) is declared {BROADCAST} but "
                    "its value differs from chain to chain (it depends on a per-chain input). "
                    "Returning one device's copy would be silently wrong.\n  fix: declare it "
                    "enn.PER_CHAIN, or reduce it across chains first, e.g. "
                    "enn.chain_mean(value)."
                )
            is_pc = batched or info.role is PER_CHAIN
            per_chain.append(is_pc)
            lift.append(is_pc and not batched)
            if batched:
                batched_out.append(leaf)
            else:
                self.unbatched.append(leaf)
        self.info = _OutInfo(treedef, _Static(tuple(statics)), tuple(per_chain), tuple(lift))
        return batched_out


def _declared_output_roles(out: Any, out_roles: Any) -> list[LeafInfo]:
    return resolve_roles(
        out, in_roles=out_roles, root="output", default=None, roles_name="out_roles"
    )


def _run_body(
    plan: _Plan, trace: _Trace, in_leaves: list, lifted: list, lifted_ids: list[int | None]
) -> tuple[list, list]:
    """One device's work: vmap the per-chain function over the local chains."""
    frame = EnsembleFrame(
        local_axis=plan.local_axis,
        mesh_axis=plan.mesh_axis,
        num_chains=plan.num_chains,
        num_local=plan.num_chains // axis_size(plan.mesh, plan.mesh_axis),
        num_devices=axis_size(plan.mesh, plan.mesh_axis),
        block_size=plan.block_size,
    )
    pcs, bcs = _split_by_role(in_leaves, plan.in_per_chain)
    if plan.reuse.closed is not None:
        batched, unbatched = plan.reuse.evaluate(pcs, bcs, lifted)
    else:

        def per_chain(pc_leaves: list, bc_leaves: list, lifted_vals: list) -> list:
            table = {i: v for i, v in zip(lifted_ids, lifted_vals) if i is not None}
            return trace.call(_merge_by_role(pc_leaves, bc_leaves, plan.in_per_chain), table)

        with entered(frame):
            batched = jax.vmap(per_chain, in_axes=(0, None, None), axis_name=plan.local_axis)(
                pcs, bcs, lifted
            )
        unbatched = list(trace.unbatched)
    pc_out, bc_out = [], []
    b_it, u_it = iter(batched), iter(unbatched)
    for is_pc, lift in zip(plan.out.per_chain, plan.out.lift_per_chain):
        if not is_pc:
            bc_out.append(next(u_it))
        elif lift:
            value = next(u_it)
            pc_out.append(jnp.broadcast_to(value, (frame.num_local,) + jnp.shape(value)))
        else:
            pc_out.append(next(b_it))
    return pc_out, bc_out


@functools.partial(jax.jit, static_argnums=0)
def _execute(plan: _Plan, in_leaves: list, lifted: list) -> Any:
    in_specs = (
        [P(plan.mesh_axis) if pc else P() for pc in plan.in_per_chain],
        [P() for _ in lifted],
    )
    out_specs = (
        [P(plan.mesh_axis) for pc in plan.out.per_chain if pc],
        [P() for pc in plan.out.per_chain if not pc],
    )
    static_tree = plan.static.tree()
    reachable = list(reachable_arrays(static_tree))
    lifted_ids = [None if slot is None else reachable[slot] for slot in plan.captures]

    def body(leaves: list, lifted_vals: list) -> tuple[list, list]:
        trace = _Trace(static_tree, plan.out_roles.tree(), plan.local_axis)
        return _run_body(plan, trace, leaves, lifted_vals, lifted_ids)

    mapped = jax.shard_map(
        body,
        mesh=plan.mesh,
        in_specs=in_specs,
        out_specs=out_specs,
        check_vma=False,
        axis_names=frozenset({plan.mesh_axis}),
    )
    return mapped(in_leaves, lifted)


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=3)
def _execute_donating(
    plan: _Plan, donated: tuple[bool, ...], kept: list, given: list, lifted: list
) -> Any:
    """`_execute` with the leaves in `given` (where `donated` is True) donated."""
    k, g = iter(kept), iter(given)
    return _execute(plan, [next(g) if d else next(k) for d in donated], lifted)


_ARG_INDEX = re.compile(r"args\[(\d+)\]")


def _check_donate(donate_argnums: Any) -> tuple[int, ...]:
    items = (donate_argnums,) if isinstance(donate_argnums, int) else donate_argnums
    try:
        items = tuple(items)
    except TypeError:
        items = (donate_argnums,)
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in items):
        raise EnsembleTypeError(
            f"donate_argnums must be a non-negative int or a tuple of them, got "
            f"{donate_argnums!r}.\n  fix: donate_argnums=(3,) donates the fourth positional "
            "argument."
        )
    return tuple(sorted(set(items)))


def check_map_options(fn: Any, mesh: Any, axis: Any, closures: Any, strict: Any) -> None:
    """`ensemble_map`'s arguments, checked when it is called (before anything traces)."""
    if not callable(fn):
        raise EnsembleTypeError(
            f"ensemble_map needs a callable (the per-chain function), got "
            f"{type(fn).__name__}.\n  fix: enn.ensemble_map(lambda x: ..., in_roles=...)."
        )
    if not isinstance(axis, str):
        raise EnsembleTypeError(
            f'axis must be the name of a mesh axis (a str), got {axis!r}.\n  fix: axis="chains".'
        )
    if not isinstance(closures, str):
        raise EnsembleTypeError(
            f"closures must be 'lift' or 'error' (a str), got {closures!r} "
            f'({type(closures).__name__}).\n  fix: closures="lift" (the default).'
        )
    if closures not in ("lift", "error"):
        raise EnsembleError(
            f"closures must be 'lift' or 'error', got {closures!r}.\n  fix: closures=\"lift\" "
            "(the default) passes captured arrays as operands."
        )
    if not isinstance(strict, bool):
        raise EnsembleTypeError(f"strict must be True or False, got {strict!r}.")
    if mesh is not None and not hasattr(mesh, "axis_names"):
        resolve_mesh(mesh, axis)  # raises MeshTypeError; a missing axis is reported at call


class EnsembleMapped:
    """A per-chain function lifted to the whole ensemble by `ensemble_map`.

    Called inside another ensemble over the same axis, it runs its function for the one
    chain at hand, so mapped functions compose.

    Example:
        >>> import jax.numpy as jnp, ensemblenn as enn
        >>> double = enn.ensemble_map(lambda x: 2 * x, in_roles=enn.PER_CHAIN)
        >>> isinstance(double, enn.EnsembleMapped), double(jnp.arange(4.0)).tolist()
        (True, [0.0, 2.0, 4.0, 6.0])
        >>> shifted = enn.ensemble_map(lambda x: double(x) + 1, in_roles=enn.PER_CHAIN)
        >>> shifted(jnp.arange(4.0)).tolist()
        [1.0, 3.0, 5.0, 7.0]
    """

    def __init__(
        self,
        fn: Callable,
        *,
        mesh: Any,
        axis: str,
        in_roles: Any,
        out_roles: Any,
        closures: str,
        strict: bool,
        block_size: int | str | None = None,
        donate_argnums: int | tuple[int, ...] = (),
    ):
        check_map_options(fn, mesh, axis, closures, strict)
        self.donate_argnums = _check_donate(donate_argnums)
        self.fn = fn
        self.mesh = mesh
        self.axis = axis
        self.in_roles = in_roles
        self.out_roles = out_roles
        self.closures = closures
        self.strict = strict
        self.block_size = check_block_size(block_size, allow_none=True, allow_auto=True)
        # Deterministic, so equal calls from different EnsembleMapped objects share programs.
        self.local_axis = f"_enn_local_{axis}"
        functools.update_wrapper(self, fn, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        frame = current_frame()
        if frame is not None and frame.mesh_axis == self.axis:
            # Already inside an ensemble of this axis: fn is per-chain code, call it as is.
            return self.fn(*args, **kwargs)
        mesh = resolve_mesh(self.mesh, self.axis)
        infos = (
            resolve_roles(self.fn, root="fn", strict=False)
            + resolve_roles(
                args, in_roles=self._args_roles(len(args)), root="args", strict=self.strict
            )
            + resolve_roles(kwargs, root="kwargs", strict=self.strict)
        )
        n = count_chains(infos)
        devices = axis_size(mesh, self.axis)
        self._check_chain_count(n, devices, infos)
        num_local = n // devices
        in_per_chain = tuple(i.role is PER_CHAIN for i in infos)
        donated = self._donated(infos, len(args))
        leaves = [
            # A donated leaf is never the shared replicated copy that `reuse` keeps.
            place(i.value, mesh, spec_for(i.role, self.axis), reuse=i.role is BROADCAST and not d)
            for i, d in zip(infos, donated)
        ]
        static_tree = eqx.filter(
            (self.fn, args, kwargs), eqx.is_array, inverse=True, replace=_ARRAY
        )
        static = _Static(static_tree)
        out_roles = _Static(self.out_roles)

        block_size = resolve_block_size(self.block_size, n)
        frame = EnsembleFrame(self.local_axis, self.axis, n, num_local, devices, block_size)
        signature = (
            static,
            in_per_chain,
            mesh,
            self.axis,
            n,
            out_roles,
            block_size,
            tuple((x.shape, x.dtype, getattr(x, "weak_type", False)) for x in leaves),
        )
        reachable = reachable_arrays(static_tree)
        fingerprint = tuple((i, a.shape, a.dtype) for i, a in reachable.items())
        found = _DISCOVERIES.get(signature)
        if (
            found is not None
            and found.fingerprint == fingerprint
            and all(i in reachable for i in found.captured_ids)
        ):
            _DISCOVERIES.move_to_end(signature)
            captured, info = [reachable[i] for i in found.captured_ids], found.info
            reuse = found.reuse
        else:
            captured, info, reuse = self._discover(
                static_tree, leaves, in_per_chain, frame, reachable
            )
            _DISCOVERIES[signature] = _Discovery(
                fingerprint, tuple(id(c) for c in captured), info, reuse
            )
            if len(_DISCOVERIES) > _MAX_DISCOVERIES:
                _DISCOVERIES.popitem(last=False)
        if captured and self.closures == "error":
            raise ClosureError(_closure_message(self.fn, captured))
        lifted = [place(c, mesh, P(), reuse=True) for c in captured]

        slot_of = {i: slot for slot, i in enumerate(reachable)}
        plan = _Plan(
            static,
            in_per_chain,
            mesh,
            self.axis,
            self.local_axis,
            n,
            block_size,
            info,
            out_roles,
            tuple(slot_of.get(id(c)) for c in captured),
            reuse,
        )
        try:
            if any(donated):
                kept = [x for x, d in zip(leaves, donated) if not d]
                given = [x for x, d in zip(leaves, donated) if d]
                pc_out, bc_out = _execute_donating(plan, donated, kept, given, lifted)
            else:
                pc_out, bc_out = _execute(plan, leaves, lifted)
        except NotImplementedError as err:
            if "Closing over" not in str(err):
                raise
            raise ClosureError(
                "A captured array could not be turned into an operand (it is held by an "
                "object ensemblenn cannot rebuild, such as a plain class instance, a "
                "custom_jvp function or an eqx.filter_jit wrapper), and it is sharded on an "
                f"Explicit mesh.\n  JAX said: {str(err).splitlines()[0]}\n  fix: pass the "
                "array as an argument (or a module field with a role) instead of capturing it."
            ) from None
        out_leaves = _merge_by_role(pc_out, bc_out, info.per_chain)
        it = iter(out_leaves)
        full = [next(it) if s is _ARRAY else s for s in info.static_leaves.tree()]
        return jax.tree.unflatten(info.treedef, full)

    def _discover(
        self,
        static_tree: Any,
        leaves: list,
        in_per_chain: tuple[bool, ...],
        frame: EnsembleFrame,
        reachable: dict[int, Any],
    ) -> tuple[list, _OutInfo, _Reuse]:
        """Trace the per-chain function abstractly: its outputs' roles, what it captures,
        and the jaxpr the program evaluates (so `fn` is traced once, not twice)."""
        trace = _Trace(static_tree, self.out_roles, self.local_axis)
        pcs, bcs = _split_by_role(leaves, in_per_chain)
        local_pcs = [
            jax.ShapeDtypeStruct((frame.num_local,) + x.shape[1:], x.dtype, weak_type=_weak(x))
            for x in pcs
        ]
        local_bcs = [jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=_weak(x)) for x in bcs]
        # A captured array sharded on a mesh keeps that type in this trace, where e.g.
        # indexing it by chain would be a sharding error on an Explicit mesh (and the jaxpr,
        # evaluated in the body, would mix meshes); it will enter the program replicated,
        # so trace it unsharded: as an input, which is then captured if used.
        sharded = [a for a in reachable.values() if _on_mesh(a)]
        plain = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in sharded]

        def discover(pc_leaves: list, bc_leaves: list, sharded_vals: list) -> tuple:
            table = {id(a): v for a, v in zip(sharded, sharded_vals)}

            def one(pc: list, bc: list) -> tuple:
                batched = trace.call(_merge_by_role(pc, bc, in_per_chain), table)
                return batched, list(trace.unbatched)

            with entered(frame):
                return jax.vmap(
                    one, in_axes=(0, None), out_axes=(0, None), axis_name=self.local_axis
                )(pc_leaves, bc_leaves)

        closed = jax.make_jaxpr(discover, axis_env=[(self.axis, frame.num_devices)])(
            local_pcs, local_bcs, plain
        )
        used = {id(v) for eqn in closed.jaxpr.eqns for v in eqn.invars}
        used |= {id(v) for v in closed.jaxpr.outvars}
        sharded_vars = closed.jaxpr.invars[len(closed.jaxpr.invars) - len(sharded) :]
        captured_sharded = [a for a, v in zip(sharded, sharded_vars) if id(v) in used]
        constants = jaxpr_constants(closed)
        captured = constants + captured_sharded
        slot = {id(c): i for i, c in enumerate(captured)}
        top = {id(c) for c in closed.consts if isinstance(c, jax.Array)}
        # Each equation records the context mesh it was traced under and is evaluated under
        # it again; one set with `jax.set_mesh` would clash with the body's manual axis.
        if all(id(c) in top for c in constants) and jax.sharding.get_abstract_mesh().empty:
            reuse = _Reuse(
                closed,
                tuple(slot.get(id(c)) if isinstance(c, jax.Array) else None for c in closed.consts),
                tuple(slot.get(id(a)) for a in sharded),
                len(trace.info.per_chain) - len(trace.unbatched),
            )
        else:
            reuse = _Reuse()
        return captured, trace.info, reuse

    def _donated(self, infos: list[LeafInfo], nargs: int) -> tuple[bool, ...]:
        """Which of the call's array leaves belong to a donated positional argument."""
        if not self.donate_argnums:
            return (False,) * len(infos)
        for i in self.donate_argnums:
            if i >= nargs:
                raise EnsembleTypeError(
                    f"donate_argnums names argument {i}, but the call has {nargs} positional "
                    f"argument(s).\n  fix: donate_argnums=({nargs - 1},) or fewer; keyword "
                    "arguments cannot be donated."
                )
        found = (_ARG_INDEX.match(i.path) for i in infos)
        return tuple(m is not None and int(m.group(1)) in self.donate_argnums for m in found)

    def _args_roles(self, nargs: int) -> Any:
        roles = self.in_roles
        if isinstance(roles, Role) or roles is None:
            return roles
        if isinstance(roles, list):
            roles = tuple(roles)
        return roles

    def _check_chain_count(self, n: int | None, devices: int, infos: list[LeafInfo]) -> None:
        if n is None:
            raise ChainCountError(
                "ensemble_map found no per-chain input, so it cannot tell how many chains "
                "there are.\n  fix: give at least one argument the role enn.PER_CHAIN "
                "(e.g. per-chain keys from enn.chain_keys(key, num_chains)) with "
                "in_roles=..., or use a module field declared with enn.per_chain()."
            )
        if n % devices:
            paths = ", ".join(
                f"{i.path}: {describe(i.value)}" for i in infos if i.role is PER_CHAIN
            )
            raise ChainCountError(
                f"{n} chains cannot be split evenly over the {devices} devices of mesh axis "
                f"{self.axis!r} (per-chain leaves: {paths}).\n  fix: use a multiple of "
                f"{devices} chains (e.g. {(n // devices + 1) * devices}), or a mesh with "
                "fewer devices."
            )


def _on_mesh(x: Any) -> bool:
    if is_explicit_sharded(x):
        return True
    try:
        return not jax.typeof(x).sharding.mesh.empty
    except AttributeError:
        return False


def _weak(x: Any) -> bool:
    return bool(getattr(x, "weak_type", False))


def _closure_message(fn: Any, captured: list[Any]) -> str:
    lines = "\n".join(
        f"  - {describe_capture(c)}"
        + ("  (sharded on an Explicit mesh)" if is_explicit_sharded(c) else "")
        for c in captured
    )
    name = getattr(fn, "__qualname__", type(fn).__name__)
    return (
        f"{name} captures {len(captured)} jax.Array(s) by closure (closures='error'):\n"
        f"{lines}\n"
        "A shard_map body must receive arrays as operands: on an Explicit mesh a captured "
        "sharded array raises NotImplementedError, and on an Auto mesh a captured per-chain "
        "array is silently treated as one shared value.\n"
        "  wrong: data = jnp.asarray(...); f = lambda x: logdensity(x, data)\n"
        "  fix:   pass data as an argument (a module field declared enn.broadcast()), or "
        "use closures='lift' (the default) to have ensemblenn pass it for you."
    )


def ensemble_map(
    fn: Callable,
    *,
    mesh: Any = None,
    axis: str = "chains",
    in_roles: Any = None,
    out_roles: Any = None,
    closures: Literal["lift", "error"] = "lift",
    strict: bool = False,
    block_size: int | Literal["auto"] | None = None,
    donate_argnums: int | tuple[int, ...] = (),
) -> EnsembleMapped:
    """Run `fn`, written for ONE chain, over every chain of a sharded ensemble.

    Per-chain leaves (leading axis = chains) are sharded over `axis` of the mesh and
    arrive in `fn` without that axis; broadcast leaves arrive whole. Within a device the
    chains are vmapped; across devices `jax.shard_map` runs, jit-compiled and cached.
    Every array enters the `shard_map` body as an explicit operand, so the program is the
    same on Auto and Explicit meshes and never captures an array by closure.

    Inputs are first laid out on the mesh (per-chain leaves sharded, broadcast leaves
    replicated). The replicated copy of a broadcast `jax.Array` (an argument, or one the
    function captures) is kept while that array is alive, so calling again with the same
    data does not copy it to every device again.

    Args:
        fn: the per-chain function (a function, a bound method, or a callable Module; its
            own array fields are partitioned by their roles like any argument).
        mesh: the mesh; `None` takes the one set with `jax.set_mesh`, else a 1-D mesh over
            all devices (`enn.default_mesh`).
        axis: the mesh axis the chains are sharded over.
        in_roles: a pytree prefix of the positional arguments with `enn.PER_CHAIN`,
            `enn.BROADCAST` or `None` (use field metadata) entries. A single role applies
            to every argument.
        out_roles: the same for the output. Declared roles win: a per-chain output that
            does not vary still comes back stacked `(num_chains, ...)`, and a broadcast
            output that varies is an `OutputRoleError`. Undeclared outputs are per-chain if
            they depend on a per-chain input, else returned once, replicated.
        closures: `"lift"` passes arrays the function captures (closure cells, globals,
            defaults, partials, bound modules, jit callees) as broadcast operands, keeping
            closure semantics; `"error"` raises `ClosureError` naming them.
        strict: if True an array argument with no role is an error instead of broadcast.
        block_size: how many chains at a time the per-chain code wrapped in
            `enn.batch_invariant` runs. With an integer, that code gives the same bits on
            any number of devices (XLA compiles it for one fixed block shape); `"auto"`
            takes `max(1, num_chains // 8)`, which depends only on the chain count (so it
            is the same on every device count) and needs no padding on up to 8 devices.
            The blocks run one after another: on a GPU a block is a sliver of the work
            (2-6x slower than one batch, measured on an H200), on a CPU a small batch
            vectorises worse. `None` (the default) runs that code over all of a device's
            chains at once, fastest, but free to differ in the last bit between device
            counts.
        donate_argnums: positional arguments whose array leaves the call may reuse for its
            outputs (`jax.jit`'s donation): an output of the same shape and role is written
            in place, with no copy, and the donated arrays are deleted. For buffers that a
            loop of calls updates (a run-wide trace); never donate an array you read again.

    Returns:
        A callable with the signature of `fn` that takes and returns whole ensembles.

    Example:
        >>> import jax, jax.numpy as jnp, ensemblenn as enn
        >>> def centre(x, w):
        ...     return w * (x - enn.chain_mean(x))
        >>> f = enn.ensemble_map(centre, in_roles=(enn.PER_CHAIN, enn.BROADCAST))
        >>> f(jnp.arange(8.0), 2.0).tolist()
        [-7.0, -5.0, -3.0, -1.0, 1.0, 3.0, 5.0, 7.0]
    """
    return EnsembleMapped(
        fn,
        mesh=mesh,
        axis=axis,
        in_roles=in_roles,
        out_roles=out_roles,
        closures=closures,
        strict=strict,
        block_size=block_size,
        donate_argnums=donate_argnums,
    )
