"""Wrap torch.distributed collectives and p2p ops, module forwards, matmuls, optimizer steps, torch.save.

Wrappers are installed in both ``torch.distributed`` and ``torch.distributed.distributed_c10d`` so that
helpers built on the primitives (all_gather_object, broadcast_object_list, ...) and FSDP2 (which calls
``dist.all_gather_single`` / ``dist.reduce_scatter_single``) are recorded too. DistributedDataParallel's
reducer issues its gradient all_reduce from C++; the probe gives every DDP model without a hook of its
own an all_reduce hook written in Python (``allreduce_mean_hook``), so those all_reduces pass through the
wrappers as well.

An op ends when its Work says so (``is_completed``), never when the Python call returns: on NCCL a
call returns once the kernel is enqueued on the communication stream, so a collective stuck on the GPU
would otherwise look finished. Works of CUDA tensors are polled by the probe's watchdog; on the CPU the
work's future (or its wait) gives the exact end.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Work
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from vigil.sources.probe.flight import reader_for
from vigil.sources.probe.probe import Probe, torch_callbacks, work_succeeded
from vigil.sources.probe.records import COLLECTIVE, P2P, OpRecord

# name -> (parameter holding the tensor whose shape must agree, parameter holding the root rank)
COLLECTIVES: dict[str, tuple[str | None, str | None]] = {
    "all_reduce": ("tensor", None),
    "broadcast": ("tensor", "src"),
    "reduce": ("tensor", "dst"),
    "all_gather": ("tensor", None),
    "all_gather_into_tensor": ("input_tensor", None),
    "all_gather_single": ("input_tensor", None),
    "all_gather_coalesced": ("input_tensor_list", None),
    "all_reduce_coalesced": ("tensors", None),
    "reduce_scatter": ("output", None),
    "reduce_scatter_tensor": ("input", None),
    "reduce_scatter_single": ("input", None),
    "gather": ("tensor", "dst"),
    "scatter": ("tensor", "src"),
    "all_to_all": (None, None),
    "all_to_all_single": (None, None),
    "barrier": (None, None),
    "monitored_barrier": (None, None),
}
# name -> (parameter holding the peer rank, direction)
P2P_OPS: dict[str, tuple[str, str]] = {
    "send": ("dst", "send"),
    "recv": ("src", "recv"),
    "isend": ("dst", "send"),
    "irecv": ("src", "recv"),
}
# The same peer named by its rank within the group (what batch_isend_irecv passes).
GROUP_PEER = {"dst": "group_dst", "src": "group_src"}
COMPUTE_FUNCS = ("matmul", "mm", "bmm", "addmm")
# torch.distributed._functional_collectives (what DTensor, tensor parallelism and DeviceMesh code call):
# name -> parameter holding the tensor(s). The deprecated spellings call these, so they are seen too.
FUNCTIONAL: dict[str, str] = {
    "all_reduce": "self",
    "broadcast": "self",
    "all_gather_single": "self",
    "reduce_scatter_single": "self",
    "all_to_all_single": "self",
    "all_reduce_coalesced": "self",
    "all_gather_single_coalesced": "self",
    "reduce_scatter_single_coalesced": "inputs",
}

_ORIGINALS: dict[tuple[Any, str], Any] = {}
_HANDLES: list[Any] = []
# Per probe, what its forward marks learned (the root modules) outlives taking the hooks out and back in.
_MARKS: dict[int, ForwardMarks] = {}


class ProbedWork(Work):
    """A work handle that tells the probe when the caller waits on it and when it finishes.

    Gloo's p2p works have no future and report completion only once waited on, so the wait is
    where an async op's completion becomes known.
    """

    def __init__(self, inner: Work, record: OpRecord, probe: Probe) -> None:
        super().__init__()
        self._inner = inner
        self._record = record
        self._probe = probe

    def wait(self, timeout: Any = None) -> bool:
        self._probe.mark_waiting(self._record)
        try:
            done = self._inner.wait() if timeout is None else self._inner.wait(timeout)
        except BaseException:
            self._probe.end_op(self._record, ok=False)
            raise
        _end_if_completed(self._probe, self._record, self._inner)
        return bool(done)

    def is_completed(self) -> bool:
        return bool(self._inner.is_completed())

    def is_success(self) -> bool:
        return bool(self._inner.is_success())

    def exception(self) -> Any:
        return self._inner.exception()

    def source_rank(self) -> int:
        return int(self._inner.source_rank())

    def result(self) -> Any:
        return self._inner.result()

    def synchronize(self) -> None:
        self._inner.synchronize()

    def get_future(self) -> Any:
        return self._inner.get_future()


_GROUPS: dict[int, tuple[Any, str, list[int]]] = {}


def _group_info(group: Any) -> tuple[str, list[int]]:
    """Name and global ranks of a process group, cached: membership never changes."""
    _, name, ranks = _group(group)
    return name, ranks


def _group(group: Any) -> tuple[Any, str, list[int]]:
    """The process group itself (the default one for None), its name and its global ranks."""
    pg = group if group is not None else dist.group.WORLD
    cached = _GROUPS.get(id(pg))
    if cached is not None:
        return cached
    name = str(getattr(pg, "group_name", "") or "0")
    try:
        ranks = list(dist.get_process_group_ranks(pg))
    except (RuntimeError, ValueError):
        ranks = []
    # Holding the group keeps its id from being reused by a later group.
    _GROUPS[id(pg)] = (pg, name, ranks)
    return _GROUPS[id(pg)]


class _Params:
    """Reads named arguments of a wrapped call without inspect.bind (a few microseconds per op)."""

    def __init__(self, func: Callable[..., Any]) -> None:
        parameters = inspect.signature(func).parameters
        self.index = {name: i for i, name in enumerate(parameters)}
        self.defaults = {name: p.default for name, p in parameters.items() if p.default is not inspect.Parameter.empty}

    def get(self, name: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if name is None:
            return None
        if name in kwargs:
            return kwargs[name]
        position = self.index.get(name)
        if position is not None and position < len(args):
            return args[position]
        return self.defaults.get(name)


def _shape_of(value: Any) -> tuple[list[list[int]], list[str]]:
    if isinstance(value, torch.Tensor):
        return [list(value.shape)], [str(value.dtype).removeprefix("torch.")]
    if isinstance(value, list | tuple) and value and all(isinstance(t, torch.Tensor) for t in value):
        return [list(t.shape) for t in value], [str(t.dtype).removeprefix("torch.") for t in value]
    return [], []


def _on_cuda(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return bool(value.is_cuda)
    return isinstance(value, list | tuple) and any(isinstance(t, torch.Tensor) and t.is_cuda for t in value)


def _wrap_collective(probe: Probe, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    tensor_param, root_param = COLLECTIVES[name]
    params = _Params(original)
    takes_async = "async_op" in params.index

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        pg, group_name, group_ranks = _group(params.get("group", args, kwargs))
        tensor = params.get(tensor_param, args, kwargs)
        sizes, dtypes = _shape_of(tensor)
        root = params.get(root_param, args, kwargs)
        is_async = bool(params.get("async_op", args, kwargs))
        record = probe.begin_op(
            group_name,
            group_ranks,
            COLLECTIVE,
            name,
            sizes,
            dtypes,
            root=root if isinstance(root, int) else None,
            is_async=is_async,
            pg=pg,
        )
        on_cuda = _on_cuda(tensor)
        if name == "monitored_barrier" and probe.flight is not None:
            # gloo's monitored barrier takes two collective numbers on every rank, and sends and receives
            # besides (rank 0 to and from every other rank): those count as p2p for the numbering.
            with _BackendOps(probe, pg, group_name, MONITORED_BARRIER_SEQS):
                return _run(probe, record, original, args, kwargs, is_async, on_cuda)
        if not is_async and takes_async and on_cuda:
            return _run_sync_on_stream(probe, record, original, args, kwargs)
        return _run(probe, record, original, args, kwargs, is_async, on_cuda)

    return wrapper


def _wrap_p2p(probe: Probe, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    peer_param, direction = P2P_OPS[name]
    params = _Params(original)
    is_async = name.startswith("i")

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        pg, group_name, group_ranks = _group(params.get("group", args, kwargs))
        tensor = params.get("tensor", args, kwargs)
        sizes, dtypes = _shape_of(tensor)
        peer = params.get(peer_param, args, kwargs)
        if not isinstance(peer, int):
            peer = _global_rank(group_ranks, params.get(GROUP_PEER[peer_param], args, kwargs))
        record = probe.begin_op(
            group_name,
            group_ranks,
            P2P,
            direction,
            sizes,
            dtypes,
            peer=peer if isinstance(peer, int) else None,
            is_async=is_async,
        )
        if probe.flight is not None and not getattr(_NESTED, "p2p", False):
            # send / recv call isend / irecv: the outermost call counts the backend's p2p ops once.
            _NESTED.p2p = True
            try:
                with _BackendOps(probe, pg, group_name, 0):
                    return _run(probe, record, original, args, kwargs, is_async, _on_cuda(tensor))
            finally:
                _NESTED.p2p = False
        return _run(probe, record, original, args, kwargs, is_async, _on_cuda(tensor))

    return wrapper


def _global_rank(group_ranks: list[int], group_peer: Any) -> int | None:
    """A peer given by its rank within the group (``group_dst`` / ``group_src``) as a global rank."""
    if not isinstance(group_peer, int):
        return None
    if not group_ranks:
        return group_peer
    return group_ranks[group_peer] if 0 <= group_peer < len(group_ranks) else None


# gloo (torch 2.13): collective numbers a monitored barrier takes on every rank.
MONITORED_BARRIER_SEQS = 2
_NESTED = threading.local()


class _BackendOps:
    """Counts the backend ops a wrapped call issued on its group beyond ``collectives``: with the Flight Recorder
    reader, those are taken off the group's sequence number to number the next collective as FR does."""

    def __init__(self, probe: Probe, pg: Any, group: str, collectives: int) -> None:
        self.probe, self.pg, self.group, self.collectives = probe, pg, group, collectives
        self.before: int | None = None

    def _issued(self) -> int | None:
        try:
            return int(self.pg._get_sequence_number_for_group())
        except (AttributeError, RuntimeError):
            return None

    def __enter__(self) -> None:
        self.before = self._issued()

    def __exit__(self, *_: object) -> None:
        after = self._issued()
        if self.before is not None and after is not None:
            self.probe.count_p2p(self.group, after - self.before - self.collectives)


def _run(
    probe: Probe,
    record: OpRecord,
    original: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    is_async: bool,
    on_cuda: bool,
) -> Any:
    try:
        result = original(*args, **kwargs)
    except BaseException:
        probe.end_op(record, ok=False)
        raise
    if not is_async:
        probe.end_op(record, ok=True)
        return result
    if isinstance(result, Work) and not _illegal(result):
        # On the CPU the future says when the op ended; otherwise (CUDA, or a work without a future) the
        # watchdog polls the work.
        if on_cuda or not _watch_future(probe, record, result):
            probe.watch_work(record, result)
        return ProbedWork(result, record, probe)
    probe.end_op(record, ok=True)
    return result


def _run_sync_on_stream(
    probe: Probe, record: OpRecord, original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """A synchronous collective on CUDA tensors, issued as async + wait (what the sync call does
    itself) so the probe keeps the work and learns when the GPU, not the enqueue, finished it."""
    kwargs = {**kwargs, "async_op": True}
    try:
        work = original(*args, **kwargs)
        if isinstance(work, Work) and not _illegal(work):
            work.wait()
    except BaseException:
        probe.end_op(record, ok=False)
        raise
    if isinstance(work, Work) and not _illegal(work):
        _end_if_completed(probe, record, work)
    else:
        probe.end_op(record, ok=True)


def _illegal(work: Work) -> bool:
    # Inside a coalescing manager the collectives return a placeholder that must not be waited on.
    return type(work).__name__ == "_IllegalWork"


def _end_if_completed(probe: Probe, record: OpRecord, work: Work) -> None:
    if work.is_completed():
        probe.end_op(record, ok=work_succeeded(work))
    else:
        probe.watch_work(record, work)


def _watch_future(probe: Probe, record: OpRecord, work: Work) -> bool:
    """On the CPU a work's future completes when the collective did: the exact end, even if nobody
    waits. (NCCL futures complete at enqueue, stream-ordered; there the watchdog's polling decides.)
    False when the work has no future."""
    try:
        future = work.get_future()
    except RuntimeError:
        return False

    def on_done(fut: Any) -> None:
        try:
            fut.value()
        except Exception:
            probe.end_op(record, ok=False)
            return
        probe.end_op(record, ok=True)

    # A done callback, not then(): then() would leave a second future, holding on_done's result, for the
    # worker thread to drop (with the GIL) after on_done was gone.
    future.add_done_callback(torch_callbacks.track(on_done, future))
    return True


# Functional collectives in flight, by id of the result tensor that wait_tensor will be given.
_FUNCTIONAL_PENDING: dict[int, tuple[weakref.ref[torch.Tensor], OpRecord]] = {}
_FUNCTIONAL_GROUPS: dict[str, tuple[Any, str, list[int]]] = {}


def _functional_group(module: Any, group: Any, tag: str) -> tuple[Any, str, list[int]]:
    """A functional collective's group (ranks, a ProcessGroup, a DeviceMesh or one of its dimensions, a
    group name) as the probe names process groups, with the process group itself (None if unresolved)."""
    resolved = module._resolve_group_name(group, tag)
    name = str(resolved)
    cached = _FUNCTIONAL_GROUPS.get(name)
    if cached is None:
        try:
            cached = _group(dist.distributed_c10d._resolve_process_group(resolved))
        except (RuntimeError, ValueError, KeyError):
            cached = (None, name, [])
        _FUNCTIONAL_GROUPS[name] = cached
    return cached


def _wrap_functional(probe: Probe, module: Any, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """A functional collective is issued by the call and ends when its result is waited on (``wait_tensor``,
    which the returned AsyncCollectiveTensor calls on first use): the op is recorded between the two."""
    params = _Params(original)
    tensor_param = FUNCTIONAL[name]

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling() or module._are_we_tracing():
            # A graph being traced waits inside the call; the compiled graph runs the operators from C++.
            return original(*args, **kwargs)
        pg, group_name, group_ranks = _functional_group(module, params.get("group", args, kwargs),
                                                        params.get("tag", args, kwargs) or "")
        sizes, dtypes = _shape_of(params.get(tensor_param, args, kwargs))
        root = params.get("src", args, kwargs)
        record = probe.begin_op(group_name, group_ranks, COLLECTIVE, name, sizes, dtypes,
                                root=root if isinstance(root, int) else None, is_async=True, pg=pg)
        try:
            result = original(*args, **kwargs)
        except BaseException:
            probe.end_op(record, ok=False)
            raise
        outputs = result if isinstance(result, list | tuple) else [result]
        waited = [getattr(out, "elem", out) for out in outputs if isinstance(out, torch.Tensor)]
        if not waited:
            probe.end_op(record)
        for tensor in waited:
            _FUNCTIONAL_PENDING[id(tensor)] = (weakref.ref(tensor, functools.partial(_dropped, probe, id(tensor))),
                                               record)
        return result

    return wrapper


def _dropped(probe: Probe, key: int, _ref: object) -> None:
    """A result never waited on was freed; torch waits on such a work itself."""
    entry = _FUNCTIONAL_PENDING.pop(key, None)
    if entry is not None:
        probe.end_op(entry[1])


def _wrap_wait_tensor(probe: Probe, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wait_tensor(tensor: torch.Tensor) -> Any:
        entry = _FUNCTIONAL_PENDING.get(id(tensor))
        if entry is None or entry[0]() is not tensor:
            return original(tensor)
        record = entry[1]
        probe.mark_waiting(record)
        try:
            out = original(tensor)
        except BaseException:
            probe.end_op(record, ok=False)
            raise
        _FUNCTIONAL_PENDING.pop(id(tensor), None)
        # A coalesced op ends when its last result has been waited on.
        if not any(other is record for _, other in _FUNCTIONAL_PENDING.values()):
            if tensor.is_cuda:
                # On CUDA wait_tensor only makes the current stream wait for the collective: an event
                # recorded behind that wait completes when the GPU has finished it; the watchdog polls it.
                probe.watch_work(record, StreamEvent())
            else:
                probe.end_op(record)
        return out

    return wait_tensor


class StreamEvent:
    """A CUDA event on the current stream, read like a Work by the probe's watchdog."""

    def __init__(self) -> None:
        self.event = torch.cuda.Event()
        self.event.record()

    def is_completed(self) -> bool:
        return bool(self.event.query())

    def exception(self) -> None:
        return None


def _install_functional(probe: Probe) -> None:
    try:
        import torch.distributed._functional_collectives as funcol
    except ImportError:
        return
    for name in FUNCTIONAL:
        _patch(funcol, name, functools.partial(_wrap_functional, probe, funcol, name))
    _patch(funcol, "wait_tensor", lambda orig: _wrap_wait_tensor(probe, orig))


def _wrap_compute(probe: Probe, original: Callable[..., Any], layer: bool = False) -> Callable[..., Any]:
    """A matmul marks compute. A layer (``layer``: linear, convolution, attention) without gradients and
    outside an optimizer step (where Shampoo- or Muon-style optimizers multiply matrices) marks evaluation -
    so an evaluation model no module hook sees still counts. A bare matmul without gradients is not taken
    for an evaluation: a power iteration that never converges multiplies matrices that way too."""
    grad_enabled = torch.is_grad_enabled
    compiling = torch.compiler.is_compiling

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if compiling():
            # Traced into a compiled graph: a mark there (a clock read) would break the graph at every layer.
            return original(*args, **kwargs)
        if not layer or grad_enabled() or probe.in_optimizer_step:
            probe.compute_begin()
        else:
            probe.eval_begin()
        return original(*args, **kwargs)

    return wrapper


class _CountedWrites:
    """A file object handed to torch.save, its writes counted into the probe: a save that keeps writing
    is slow, one that stopped writing is stuck."""

    def __init__(self, inner: Any, probe: Probe) -> None:
        self._inner = inner
        self._probe = probe

    def write(self, data: Any) -> Any:
        written = self._inner.write(data)
        self._probe.checkpoint_bytes += written if isinstance(written, int) else len(data)
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _wrap_checkpoint(probe: Probe, original: Callable[..., Any]) -> Callable[..., Any]:
    """While a rank saves a checkpoint its peers may wait for minutes: that is not a hang, as long as the
    save keeps writing (the watchdog follows its bytes)."""

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        previous = dict(probe.activity)
        probe.set_activity("checkpoint", original.__name__)
        if len(args) >= 2 and callable(getattr(args[1], "write", None)):
            args = (args[0], _CountedWrites(args[1], probe), *args[2:])
        elif callable(getattr(kwargs.get("f"), "write", None)):
            kwargs["f"] = _CountedWrites(kwargs["f"], probe)
        try:
            return original(*args, **kwargs)
        finally:
            probe.activity = previous

    return wrapper


def _patch(owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    original = getattr(owner, name, None)
    if original is None or (owner, name) in _ORIGINALS:
        return
    _ORIGINALS[(owner, name)] = original
    setattr(owner, name, make(original))


class ForwardMarks:
    """Compute / evaluation marks and the step's batch from module forwards.

    A global forward pre-hook puts every module call on nn.Module's slow path (a few microseconds each, a
    large share of a small model's step). So it runs only until the first optimizer step, which shows the
    modules called outside any other (the roots: the model, its loss); from then on only the roots carry
    a hook, and matmuls inside them mark compute on their own (``_wrap_compute``).
    """

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        # Held weakly: the probe keeps no model alive.
        self.called: dict[int, weakref.ref[torch.nn.Module]] = {}
        self.roots: list[weakref.ref[torch.nn.Module]] = []
        self.handles: list[Any] = []
        self.learning = False

    def install(self) -> None:
        roots = [root for ref in self.roots if (root := ref()) is not None]
        if roots:
            self.handles = [root.register_forward_pre_hook(self.mark) for root in roots]
        else:
            self.learning = True
            self.handles = [register_module_forward_pre_hook(self.mark)]

    def uninstall(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
        self.learning = False
        self.called = {}

    def mark(self, module: torch.nn.Module, inputs: Any) -> None:
        if torch.compiler.is_compiling():
            # A module inside a compiled region: the compiled module's own call (eager) carries the mark.
            return
        probe = self.probe
        if module.training and torch.is_grad_enabled():
            probe.compute_begin()
            if probe.step_batch is None and inputs and isinstance(inputs[0], torch.Tensor) and inputs[0].dim():
                probe.note_batch(int(inputs[0].shape[0]), str(inputs[0].device))
        else:
            probe.eval_begin()
        if self.learning:
            seen = self.called.get(id(module))
            if seen is None or seen() is not module:
                self.called[id(module)] = weakref.ref(module)

    def step_taken(self) -> None:
        """At the first optimizer step after some forwards: hook the roots, drop the global hook. When every
        root is gone (a new model replaced them), learn again."""
        if not self.learning:
            if self.roots and all(ref() is None for ref in self.roots):
                self.roots = []
                self.uninstall()
                self.install()
            return
        called = [module for ref in self.called.values() if (module := ref()) is not None]
        if not called:
            return
        inner = {id(child) for module in called for child in module.modules() if child is not module}
        self.roots = [weakref.ref(module) for module in called if id(module) not in inner]
        self.uninstall()
        self.install()


def _step_hooks(probe: Probe, marks: ForwardMarks) -> list[Any]:
    def before(*_: Any) -> None:
        probe.in_optimizer_step = True
        if probe.flight is not None:
            # The step's collectives in the FR ring have ended by now (DDP waits for its buckets at the end
            # of backward): the cursor, read here, gives this moment as their end at the latest.
            probe.flight.observe(time.time())

    def after(*_: Any) -> None:
        probe.in_optimizer_step = False
        probe.step()
        marks.step_taken()

    return [register_optimizer_step_pre_hook(before), register_optimizer_step_post_hook(after)]


def allreduce_mean_hook(process_group: Any, bucket: Any) -> Any:
    """DDP's gradient all_reduce issued from Python, so the collective wrappers see it.

    The bucket is scaled by 1 / group size with a multiplication, as DDP's C++ path does when it has no
    hook (there fused with the copy into the bucket). torch's ``allreduce_hook`` divides instead: the same
    extra pass over every gradient, about 1.5x slower on the CPU. With a world size that is a power of two
    the two are bit for bit the same.
    """
    group: Any = process_group if process_group is not None else dist.group.WORLD
    tensor = bucket.buffer()
    tensor.mul_(1.0 / group.size())
    future = dist.all_reduce(tensor, group=group, async_op=True).get_future()

    def reduced(fut: Any) -> Any:  # a new function each call: the tracker follows each one until torch drops it
        return fut.value()[0]

    return future.then(torch_callbacks.track(reduced, future))


# DDP checks a hook's annotations against the classes themselves; postponed (string) ones would be refused.
allreduce_mean_hook.__annotations__ = {
    "process_group": dist.ProcessGroup, "bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor],
}


def _wrap_ddp_forward(probe: Probe, original: Callable[..., Any]) -> Callable[..., Any]:
    """Before a DDP model's first forward (when DDP allows a comm hook and the user has had the
    chance to register one), give it the all_reduce hook, written in Python - unless the probe reads this
    process's collectives from the Flight Recorder ring (vigil.sources.probe.flight), which sees the
    reducer's all_reduces with no hook and no Python in the step."""

    @functools.wraps(original)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not getattr(self, "_vigil_hooked", False):
            self._vigil_hooked = True
            user_hook = getattr(self, "_vigil_user_hook", False) or bool(getattr(self, "_comm_hooks", None))
            from_ring = probe.flight_reader() is not None
            if getattr(self, "reducer", None) is not None and not user_hook and not from_ring:
                # A hook registered before the probe was installed (a built-in one leaves no trace in
                # Python) makes DDP refuse a second: the user's hook stays, the job never breaks.
                with contextlib.suppress(RuntimeError):
                    self.register_comm_hook(self.process_group, allreduce_mean_hook)
        return original(self, *args, **kwargs)

    return forward


def _wrap_destroy(probe: Probe, original: Callable[..., Any]) -> Callable[..., Any]:
    """The Flight Recorder ring's last collectives into the records before the process group goes."""

    @functools.wraps(original)
    def destroy(*args: Any, **kwargs: Any) -> Any:
        probe.read_flight_recorder()
        return original(*args, **kwargs)

    return destroy


def _wrap_register_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def register(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not getattr(self, "_vigil_hooked", False):
            # The user's own hook (or a built-in C++ one) wins; a Python hook's collectives are seen anyway.
            self._vigil_user_hook = True
        return original(self, *args, **kwargs)

    return register


def install_hooks(probe: Probe) -> None:
    """Patch torch in place; idempotent."""
    if probe.flight_factory is None:
        probe.flight_factory = reader_for
    c10d = dist.distributed_c10d
    for name in COLLECTIVES:
        original = getattr(c10d, name, None)
        if original is None:
            continue
        wrapped = _wrap_collective(probe, name, original)
        for owner in (c10d, dist):
            if (owner, name) not in _ORIGINALS:
                _ORIGINALS[(owner, name)] = getattr(owner, name)
                setattr(owner, name, wrapped)
    for name in P2P_OPS:
        original = getattr(c10d, name)
        wrapped = _wrap_p2p(probe, name, original)
        for owner in (c10d, dist):
            if (owner, name) not in _ORIGINALS:
                _ORIGINALS[(owner, name)] = getattr(owner, name)
                setattr(owner, name, wrapped)
    _install_functional(probe)
    for name in COMPUTE_FUNCS:
        _patch(torch, name, lambda orig: _wrap_compute(probe, orig))
    _patch(torch.Tensor, "__matmul__", lambda orig: _wrap_compute(probe, orig))
    # Convolutions and attention too: an evaluation of a CNN or of an attention block on the unwrapped model
    # (which no module hook sees after the first step) still marks evaluation.
    for name in ("linear", "conv1d", "conv2d", "conv3d", "scaled_dot_product_attention"):
        _patch(torch.nn.functional, name, lambda orig: _wrap_compute(probe, orig, layer=True))
    _patch(torch, "save", lambda orig: _wrap_checkpoint(probe, orig))
    ddp = torch.nn.parallel.DistributedDataParallel
    _patch(ddp, "forward", lambda orig: _wrap_ddp_forward(probe, orig))
    _patch(c10d, "destroy_process_group", lambda orig: _wrap_destroy(probe, orig))
    _patch(dist, "destroy_process_group", lambda orig: _wrap_destroy(probe, orig))
    _patch(ddp, "register_comm_hook", _wrap_register_hook)
    _patch(ddp, "_register_builtin_comm_hook", _wrap_register_hook)
    if not _HANDLES:
        marks = _MARKS.get(id(probe))
        if marks is None:
            marks = _MARKS[id(probe)] = ForwardMarks(probe)
        marks.install()
        _HANDLES.append(marks)
        _HANDLES.extend(_step_hooks(probe, marks))


def uninstall_hooks() -> None:
    for (owner, name), original in _ORIGINALS.items():
        setattr(owner, name, original)
    _ORIGINALS.clear()
    for handle in _HANDLES:
        handle.uninstall() if isinstance(handle, ForwardMarks) else handle.remove()
    _HANDLES.clear()
    _GROUPS.clear()
    _FUNCTIONAL_GROUPS.clear()
    _FUNCTIONAL_PENDING.clear()
