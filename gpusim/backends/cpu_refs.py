"""`by_reference`: a CPU kernel's phases get its arrays and parameters as one pointer.

numba passes a named tuple by value, flattened: each array of `s` is seven
to eleven machine words, so every call of a phase or helper with an env's 20
to 30 arrays moved about 250 arguments, and LLVM declined to inline a callee
with any branching at that size (a one-line guard with an `or` cost 115 ns a
call). numba also counts references to each array a call receives: atomic
writes to counters that every thread shares, so replicas on two threads ran
slower than on one (simple_spread with 3 agents: 660 against 461 ns per
agent-step).

`by_reference(t)` stores the named tuple `t` once, in the frame of the
function that runs a chunk of replicas, and returns a `TupleRef`: a pointer
whose attributes read the tuple's fields (`s.pos`, `p.dt`), so phases read
`s.name` and `p.name` unchanged. The backend inlines every phase into that
function, where LLVM sees that nothing writes the tuple and keeps its fields
in registers. Its arrays have a null meminfo, which numba's reference
counting skips: the kernel's caller holds the arrays for the whole call.
CUDA kernels keep the tuples (device functions count no references).

`by_reference_checked` is the same for check_env's bounds-checked kernels, with
every C-contiguous array typed as layout "A": the phases and every helper that
takes an array then compile as new overloads (with numba's bounds checks), so
the overloads a run's kernels use are never the checked ones, nor the reverse.
"""
from numba.core import cgutils, types
from numba.core.datamodel import models
from numba.core.typing.templates import AttributeTemplate
from numba.extending import infer_getattr, intrinsic, lower_getattr_generic, register_model


class TupleRef(types.Type):
    """A pointer to a named tuple in the caller's frame."""

    def __init__(self, tuple_type):
        self.tuple_type = tuple_type
        super().__init__(name=f"TupleRef({tuple_type})")


@register_model(TupleRef)
class TupleRefModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        pointee = dmm.lookup(fe_type.tuple_type).get_value_type()
        super().__init__(dmm, fe_type, pointee.as_pointer())


@infer_getattr
class TupleRefAttributes(AttributeTemplate):
    key = TupleRef

    def generic_resolve(self, ref, attr):
        fields = ref.tuple_type.fields
        if attr in fields:
            return ref.tuple_type.types[fields.index(attr)]
        return None


@lower_getattr_generic(TupleRef)
def _field(context, builder, ref, pointer, attr):
    index = ref.tuple_type.fields.index(attr)
    return builder.load(cgutils.gep_inbounds(builder, pointer, 0, index))


def _uncounted(context, builder, tuple_type, value):
    """`value` with a null meminfo in each of its arrays."""
    for k, member in enumerate(tuple_type):
        if isinstance(member, types.Array):
            array = context.make_array(member)(context, builder,
                                               value=builder.extract_value(value, k))
            array.meminfo = cgutils.get_null_value(array.meminfo.type)
            value = builder.insert_value(value, array._getvalue(), k)
    return value


def _any_layout(tuple_type):
    """`tuple_type` with its C-contiguous arrays as layout "A" (same data model)."""
    members = [t.copy(layout="A") if isinstance(t, types.Array) and t.layout == "C" else t
               for t in tuple_type]
    if isinstance(tuple_type, types.NamedUniTuple) or isinstance(tuple_type, types.NamedTuple):
        return types.NamedTuple(members, tuple_type.instance_class)
    return types.Tuple(members)


@intrinsic
def by_reference_checked(typingctx, tup):
    """`by_reference` with the arrays retyped as layout "A" (see the module's docstring)."""
    if not isinstance(tup, types.BaseNamedTuple):
        return by_reference(typingctx, tup)
    target = _any_layout(tup)

    def codegen(context, builder, signature, args):
        value = _uncounted(context, builder, tup, args[0])
        cast = context.get_constant_undef(target)
        for k, (src, dst) in enumerate(zip(tup, target)):
            member = builder.extract_value(value, k)
            cast = builder.insert_value(cast, context.cast(builder, member, src, dst), k)
        slot = cgutils.alloca_once(builder, cast.type)
        builder.store(cast, slot)
        return slot
    return TupleRef(target)(tup), codegen


@intrinsic
def by_reference(typingctx, tup):
    """A `TupleRef` to a copy of named tuple `tup` whose arrays are not reference counted
    (another tuple, such as the empty parameters of a kernel that has none, stays a
    tuple, its arrays uncounted)."""
    if not isinstance(tup, types.BaseTuple):
        return None
    if not isinstance(tup, types.BaseNamedTuple):
        return tup(tup), lambda context, builder, sig, args: _uncounted(context, builder, tup,
                                                                         args[0])

    def codegen(context, builder, signature, args):
        value = _uncounted(context, builder, tup, args[0])
        slot = cgutils.alloca_once(builder, value.type)
        builder.store(value, slot)
        return slot
    return TupleRef(tup)(tup), codegen
