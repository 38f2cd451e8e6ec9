"""The C++ unit-test programs under tf_ops/common/tests and the core files
each one links: kept apart from the library's own build (library.py), which
never compiles them."""
import os

from tfring.build.library import source_root


# What each C++ test program under tf_ops/common/tests links besides its own
# file: the pieces of the core it exercises, relative to tf_ops/common, none
# with MPI or TensorFlow. The pytest wrappers under tests/common build from
# here, so a file split or moved in the core changes this one list (and
# tests/build/test_library.py checks that every entry is a library source
# and that Bazel's BUILD agrees). The programs in MPI_UNIT_TESTS also link
# MPI (built with mpicxx); those in NCCL_LOGIC_UNIT_TESTS are built with
# TFRING_NCCL_PLANE_LOGIC. Programs in a subfolder (ranks/, fuzz/, bench/)
# are no Bazel cc_test: they need arguments.
_NEGOTIATION_PIECES = [
    "controller.cc", "coordinator.cc", "validation.cc", "speculation.cc", "message.cc",
    "fusion_buffer.cc", "reduction.cc", "common.cc", "response_cache.cc", "timeline.cc",
    "tensor_queue.cc", "executor.cc", "ops/data_plane_selector.cc", "config.cc",
    "logging.cc", "ops/adasum.cc", "peer_monitor.cc"]
_TCP_WIRE = ["transport/tcp/sha256.cc", "transport/tcp/wire.cc"]
_TCP_WORLD = _TCP_WIRE + [
    "transport/tcp/tcp_communicator.cc", "transport/tcp/handshake.cc", "transport/tcp/mesh.cc",
    "transport/tcp/world.cc", "transport/tcp/liveness.cc", "transport/tcp/peer_frame.cc",
    "transport/tcp/socket.cc", "transport/tcp/rendezvous_client.cc",
    "transport/communicator.cc", "peer_monitor.cc", "logging.cc"]
# The shared-memory data plane over its forked jobs (shm_job.h).
_SHM_PLANE = [
    "reduction.cc", "common.cc", "peer_monitor.cc", "logging.cc", "config.cc", "fusion_buffer.cc",
    "ops/shm_segment.cc", "ops/shm_data_plane.cc", "ops/shm_single_copy.cc"]
# The executor's pipeline over a GPU executor and the NCCL plane (fake_gpu_stack.h).
_GPU_PIPELINE = [
    "ops/nccl_communicators.cc", "ops/nccl_data_plane.cc", "ops/gpu_executor.cc", "executor.cc",
    "fusion_buffer.cc", "reduction.cc", "common.cc"]
UNIT_TEST_SOURCES = {
    "negotiation_test.cc": _NEGOTIATION_PIECES,
    "response_cache_test.cc": _NEGOTIATION_PIECES,
    "execution_test.cc": ["executor.cc", "device_watchdog.cc", "peer_monitor.cc",
                          "ops/data_plane_selector.cc",
                          "fusion_buffer.cc", "reduction.cc", "common.cc", "config.cc",
                          "logging.cc", "tensor_queue.cc", "message.cc"],
    "adasum_test.cc": ["ops/adasum.cc", "reduction.cc", "common.cc", "logging.cc"],
    "failures_test.cc": ["peer_monitor.cc", "common.cc", "logging.cc"],
    "speculation_test.cc": _NEGOTIATION_PIECES,
    "reduction_test.cc": ["reduction.cc", "common.cc"],
    "shm_plane_test.cc": _SHM_PLANE,
    "shm_failures_test.cc": _SHM_PLANE,
    # The shm plane's bench (benchmarks/shm_rank_order.py).
    "bench/shm_bench.cc": _SHM_PLANE,
    "tcp_client_test.cc": _TCP_WIRE + ["transport/tcp/socket.cc",
                                       "transport/tcp/rendezvous_client.cc",
                                       "transport/tcp/topology.cc"],
    "tcp_comm_test.cc": _TCP_WORLD,
    # The allreduce algorithms over TCP worlds on threads.
    "allreduce_algorithms_test.cc": _TCP_WORLD + ["ops/allreduce_algorithms.cc", "reduction.cc",
                                                  "common.cc", "config.cc"],
    # One rank of a multi-process job (tests/common/transport/test_tcp_communicator.py).
    "ranks/tcp_comm_rank.cc": _TCP_WORLD,
    "peer_frame_test.cc": _TCP_WIRE + ["transport/tcp/peer_frame.cc"],
    "wait_policy_test.cc": ["transport/communicator.cc", "peer_monitor.cc", "logging.cc"],
    # Every CPU plane over MPI and over TCP (tests/common/ops/test_conformance_cpp.py).
    "conformance_test.cc": _TCP_WORLD + [
        "ops/mpi_data_plane.cc", "ops/ring_data_plane.cc", "ops/ring_pipeline.cc",
        "ops/hierarchical_data_plane.cc",
        "ops/allreduce_algorithms.cc",
        "ops/shm_data_plane.cc", "ops/shm_single_copy.cc", "ops/shm_segment.cc", "ops/adasum.cc",
        "ops/comm_point_to_point.cc", "mpi/mpi_context.cc", "mpi/mpi_communicator.cc",
        "common.cc", "reduction.cc", "config.cc", "fusion_buffer.cc"],
    # The GPU pieces' logic over a fake NCCL/CUDA (NCCL_LOGIC_UNIT_TESTS).
    "nccl_communicators_test.cc": ["ops/nccl_communicators.cc", "reduction.cc", "common.cc"],
    "nccl_data_plane_test.cc": _GPU_PIPELINE,
    "gpu_executor_test.cc": _GPU_PIPELINE + ["device_watchdog.cc", "peer_monitor.cc"],
    "hierarchical_gpu_data_plane_test.cc": _GPU_PIPELINE + ["ops/hierarchical_gpu_data_plane.cc"],
    "fuzz/fuzz_wire.cc": _TCP_WIRE + ["transport/tcp/topology.cc"],
    "fuzz/fuzz_peer_frame.cc": _TCP_WIRE + ["transport/tcp/peer_frame.cc"],
}

# The programs that link MPI (and the core's mpi/ files).
MPI_UNIT_TESTS = ["conformance_test.cc"]

# The programs of the GPU pieces' logic over a fake NCCL/CUDA: built with
# TFRING_NCCL_PLANE_LOGIC, which compiles that logic without nccl.h (the
# CPU library leaves it out).
NCCL_LOGIC_UNIT_TESTS = ["nccl_communicators_test.cc", "nccl_data_plane_test.cc",
                         "gpu_executor_test.cc", "hierarchical_gpu_data_plane_test.cc"]


def unit_test_sources(program, root=None):
    """The files to compile into the C++ test program ``program`` (a key of
    :data:`UNIT_TEST_SOURCES`, relative to tf_ops/common/tests), absolute:
    the program's own file first. ``root`` defaults to :func:`tfring.build.library.source_root`.

    Raises:
        KeyError: no such test program.
    """
    common = os.path.join(root or source_root(), "tf_ops", "common")
    return ([os.path.join(common, "tests", *program.split("/"))]
            + [os.path.join(common, *rel.split("/")) for rel in UNIT_TEST_SOURCES[program]])
