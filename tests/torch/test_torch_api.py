"""tfring.torch in one process, without a launcher: errors before init(),
and Horovod's torch names."""
import re

import pytest

from support import run_python


def test_collectives_before_init_raise_a_value_error(torch_ready):
    result = run_python(
        "import torch, tfring.torch as hvd\n"
        "for call in (lambda: hvd.allreduce(torch.ones(1)), lambda: hvd.rank(),\n"
        "             lambda: hvd.broadcast_parameters({'w': torch.ones(1)}, 0)):\n"
        "    try:\n"
        "        call()\n"
        "    except ValueError as e:\n"
        "        print('ValueError', e)\n")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 3 and all(re.search(r"ValueError .*init", ln) for ln in lines), lines


HOROVOD_TORCH_NAMES = """
init shutdown is_initialized size rank local_size local_rank cross_size cross_rank
is_homogeneous mpi_threads_supported mpi_enabled mpi_built gloo_enabled gloo_built nccl_built
cuda_built rocm_built ProcessSet add_process_set remove_process_set global_process_set
Average Sum Adasum Min Max Product Compression HorovodInternalError HostsUpdatedInterrupt
allreduce allreduce_async allreduce_ allreduce_async_ grouped_allreduce grouped_allreduce_async
grouped_allreduce_ grouped_allreduce_async_ allgather allgather_async grouped_allgather
grouped_allgather_async broadcast broadcast_async broadcast_ broadcast_async_ alltoall
alltoall_async reducescatter reducescatter_async grouped_reducescatter
grouped_reducescatter_async join barrier poll synchronize broadcast_object allgather_object
broadcast_parameters broadcast_optimizer_state DistributedOptimizer SyncBatchNorm elastic
sparse_allreduce_async start_timeline stop_timeline ccl_built ddl_built
""".split()


def test_horovod_torch_names_exist(torch_ready):
    import tfring.torch as hvd
    missing = [n for n in HOROVOD_TORCH_NAMES if not hasattr(hvd, n)]
    assert not missing
    for n in ("run", "State", "ObjectState", "TorchState", "ElasticSampler"):
        assert hasattr(hvd.elastic, n), n


@pytest.mark.parametrize("name,wire", [("fp16", "float16"), ("bf16", "bfloat16")])
def test_16bit_compression_round_trip(torch_ready, name, wire):
    import torch

    from tfring.torch import Compression
    compressor = getattr(Compression, name)
    x = torch.tensor([1.5, -2.25], dtype=torch.float64)
    sent, ctx = compressor.compress(x)
    assert sent.dtype == getattr(torch, wire)
    assert torch.equal(compressor.decompress(sent, ctx), x)
    ints = torch.arange(3)
    assert compressor.compress(ints)[0] is ints
    assert compressor.predivide


def test_distributed_optimizer_checks_its_arguments(torch_ready):
    import torch

    import tfring.torch as hvd
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="lacks"):
        hvd.DistributedOptimizer(opt, named_parameters=[("w", model.weight)])
    with pytest.raises(ValueError, match="op"):
        hvd.DistributedOptimizer(opt, op=hvd.Min)
    with pytest.raises(ValueError, match="predivide"):
        hvd.DistributedOptimizer(opt, op=hvd.Sum, gradient_predivide_factor=2.0)
    for bad in ("fp16", 16):
        with pytest.raises(TypeError, match="compression must be a Compressor"):
            hvd.DistributedOptimizer(opt, compression=bad)
