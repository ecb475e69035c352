"""The recording of a real kernel run (collectives._kernel_trace) and its
drawing; the hook into interpret mode it rests on, on each JAX release."""

import jax
import pytest

from collectives import _compat
from collectives import _figure

pytestmark = pytest.mark.skipif(
    not _compat.HAS_INTERPRET_KERNELS,
    reason=f"the kernels need JAX 0.10.2 or newer (this is {jax.__version__})")

N = 8


@pytest.fixture(scope="module")
def all_gather_trace():
    from collectives._kernel_trace import record
    return record("kernel_all_gather", dims=(4, 128))


def test_all_gather_sends_n_minus_1_blocks_to_the_right(all_gather_trace):
    trace = all_gather_trace
    block = 4 * 128 * 4  # one device's float32[4, 128]
    assert trace.n_devices == N
    for device in range(N):
        sent = [d for d in trace.remote_dmas() if d.device == device]
        assert len(sent) == N - 1, (device, sent)
        assert {d.target for d in sent} == {(device + 1) % N}
        assert {d.bytes for d in sent} == {block}
        assert len({d.step for d in sent}) == N - 1  # one a step


def test_all_gather_waits_for_each_block_before_forwarding_it(all_gather_trace):
    trace = all_gather_trace
    for device in range(N):
        sends = [d for d in trace.remote_dmas() if d.device == device]
        recv_waits = [op for op in trace.waits() if op.device == device
                      and trace.sem_name(op.sem).startswith("recv")]
        assert len(recv_waits) == N - 1
        # the block forwarded in step k + 1 arrived (was waited for) in step k
        for sent, waited in zip(sends[1:], recv_waits, strict=False):
            assert waited.order < sent.order
    barrier = [op for op in trace.semaphore_ops
               if op.kind == "signal" and trace.sem_name(op.sem) == "barrier"]
    assert sorted((op.device, op.target) for op in barrier) == sorted(
        (d, (d + k) % N) for d in range(N) for k in (1, N - 1))


def test_the_drawing_reads_in_both_columns(all_gather_trace, tmp_path):
    pytest.importorskip("matplotlib", reason="the drawing needs matplotlib: "
                        "pip install '.[bench]'")
    from collectives import _kernel_trace_plot

    records = _kernel_trace_plot.save(all_gather_trace, tmp_path / "ag.svg")
    for width, path in _figure.columns(tmp_path / "ag.svg"):
        assert path.exists()
        facts = _figure.read_record(path)
        assert facts == records[width]
        assert _figure.problems(facts, width) == []
        assert facts["width_px"] <= _figure.COLUMN_PX[width]


def test_record_refuses_a_recipe_that_is_no_kernel():
    from collectives._kernel_trace import record
    with pytest.raises(ValueError,
                       match=r"'psum'.*not a kernel recipe.*kernel_all_gather"):
        record("psum")


# -- collectives._compat.interpret_events: the private hook, per release ------

def _kernel_events():
    from collectives._kernel_trace import record
    return record("kernel_all_gather", dims=(1, 128))


def test_the_hook_restores_interpret_mode_after_the_block():
    module = _compat._interpret_module()
    names = ("dma_wait", "semaphore_signal", "semaphore_wait",
             "get_barrier_semaphore", "DMA")
    before = {name: getattr(module, name) for name in names}
    read = module.DMA.execute_read
    with _compat.interpret_events(lambda kind, fields: None):
        assert all(getattr(module, name) is not before[name] for name in names)
    assert {name: getattr(module, name) for name in names} == before
    assert module.DMA.execute_read is read


@pytest.mark.skipif(_compat.JAX_VERSION[:2] != (0, 10),
                    reason="0.10's interpret mode (its dma_start has no "
                    "dst_local_core_id)")
def test_the_hook_reads_0_10s_callbacks():
    import inspect
    module = _compat._interpret_module()
    assert "dst_local_core_id" not in inspect.signature(module.dma_start).parameters
    assert len(_kernel_events().remote_dmas()) == N * (N - 1)


@pytest.mark.skipif(_compat.JAX_VERSION < (0, 12, 0),
                    reason="0.12's interpret mode (its dma_start takes "
                    "dst_local_core_id; its DMA's clock is a class of its own)")
def test_the_hook_reads_0_12s_callbacks():
    import inspect
    module = _compat._interpret_module()
    assert "dst_local_core_id" in inspect.signature(module.dma_start).parameters
    assert len(_kernel_events().remote_dmas()) == N * (N - 1)


def test_the_hook_names_a_release_without_interpret_kernels(monkeypatch):
    monkeypatch.setattr(_compat, "HAS_INTERPRET_KERNELS", False)
    with (pytest.raises(RuntimeError, match=r"0\.10\.2 or newer"),
          _compat.interpret_events(lambda kind, fields: None)):
        pass
