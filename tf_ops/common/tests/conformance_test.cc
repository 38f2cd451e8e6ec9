// The data planes' conformance suite: every plane behind DataPlane (MPI's
// own, shared memory, the ring and the hierarchical plane over MPI, the ring
// over TCP) runs the same checks: allreduce with every dtype and reduce op,
// in place and out of place, with the core's prescale/postscale and average
// around it; ragged allgather; broadcast from every root, in place and out
// of place; alltoall with uneven (and empty) splits; reducescatter with
// uneven shares; barrier; Adasum against MPI's; each at sizes around the
// plane's own thresholds (shm chunk and one-step limit, ring piece sizes,
// the single-copy cut-over), with tuned-down variants so that small messages
// already cross many steps. Every result is compared byte for byte with a
// reference computed in the test from every rank's inputs (plane_data.h),
// so no check leans on a transport under test.
//
// Why ranks are processes launched by mpiexec rather than threads over an
// in-process transport: MPI's own plane needs one process per rank, and the
// shared-memory plane maps its segment per process and reads other ranks'
// memory by pid (single copy), so only processes cover every plane with one
// harness. mpiexec is then also the launcher, MPI_COMM_WORLD the bootstrap
// of the shm segment and of the TCP mesh (listener addresses swapped with
// one MPI_Allgather), and the TCP world is the real communicator on
// loopback, as in a job.
//
// Built with mpicxx from tfring.build.unit_tests and run at np=1,2,3 by
// tests/common/ops/test_conformance_cpp.py, which reads one line per plane
// and rank: "[R] conformance PLANE: N checks, M failed".
//
//   conformance_test [--plane LABEL]... [--debug]
//
// To add a plane: add a PlaneUnderTest in MakePlanes() with its thresholds,
// and its label to PLANES in the pytest driver.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../logging.h"
#include "../mpi/mpi_context.h"
#include "../ops/mpi_data_plane.h"
#include "../ops/ring_data_plane.h"
#include "../ops/shm_data_plane.h"
#include "../transport/tcp/tcp_communicator.h"
#include "check.h"
#include "plane_data.h"

using namespace tfring;
using namespace tfring::test;

namespace {

struct PlaneUnderTest {
  std::string label;
  std::unique_ptr<DataPlane> plane;
  // Bytes one rank moves per pipeline step (shm chunk, ring piece): sizes
  // are chosen around 1, size and size^2 of them.
  int64_t step = 4096;
  // Allreduces up to this many bytes take a one-step path (shm); 0: none.
  int64_t small = 0;
  // Broadcasts and allgathers from this many bytes read peers' memory
  // directly (shm single copy); -1: never.
  int64_t single_copy_min = -1;
  // Whether every dtype runs at the threshold sizes too (cheap when the
  // step is small), or only a few.
  bool every_type_at_edges = true;
  // Whether Adasum is expected to run (compared with MPI's).
  bool adasum = false;
  // Whether only allreduce is checked: a plane that differs from another
  // one only in its allreduce algorithm (the rest is the same code).
  bool allreduce_only = false;
  // Whether an allgather whose input already sits at this rank's place in
  // the output is checked. DataPlane does not promise it and the core never
  // asks for it; MPI's plane hands the aliased buffers to MPI, which refuses.
  bool allgathers_in_place = true;
};

int g_size = 1;
int g_rank = 0;
int g_salt = 0;

std::string Describe(const PlaneUnderTest& p, const char* what, DataType dt, ReduceOp op,
                     int64_t n) {
  return p.label + " " + what + " " + DataTypeName(dt) + " " + ReduceOpName(op) + " n=" +
         std::to_string(n);
}

void CheckStatus(const Status& s, const std::string& what) {
  CHECKF(s.ok(), "%s: %s", what.c_str(), s.message().c_str());
}

void CheckBytes(const char* got, const char* want, int64_t bytes, const std::string& what) {
  const int64_t at = FirstDifference(got, want, bytes);
  CHECKF(at < 0, "%s: first wrong byte %lld of %lld", what.c_str(), (long long)at,
         (long long)bytes);
}

// Element counts for a plane and dtype: small and odd ones, and with
// `edges` those around the plane's thresholds.
std::vector<int64_t> Counts(const PlaneUnderTest& p, int64_t esize, bool edges) {
  const int size = g_size;
  std::vector<int64_t> counts = {0, 1, 2, 3, 7, size + 1, 65, 1001};
  if (edges) {
    const int64_t c = std::max<int64_t>(p.step / esize, 1);
    for (int64_t v : {c - 1, c, c + 1, size * c - 1, size * c + 1, 2 * size * c + 3}) {
      counts.push_back(v);
    }
    if (p.small > 0) {
      counts.push_back(p.small / esize);
      counts.push_back(p.small / esize + 1);
    }
  }
  std::sort(counts.begin(), counts.end());
  counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
  counts.erase(std::remove_if(counts.begin(), counts.end(), [](int64_t v) { return v < 0; }),
               counts.end());
  return counts;
}

bool RunsEdges(const PlaneUnderTest& p, DataType dt) {
  return p.every_type_at_edges || dt == DataType::UINT8 || dt == DataType::FLOAT16 ||
         dt == DataType::FLOAT32 || dt == DataType::FLOAT64;
}

void CheckAllreduce(PlaneUnderTest& p, int64_t n, DataType dt, ReduceOp op, bool in_place) {
  const int salt = ++g_salt;
  const int64_t bytes = n * DataTypeSize(dt);
  std::vector<char> in = Filled(n, dt, g_rank, salt);
  const std::vector<char> original = in;
  std::vector<char> out(in.size(), static_cast<char>(0xA5));
  const std::string what =
      Describe(p, in_place ? "allreduce in place" : "allreduce", dt, op, n);
  CheckStatus(in_place ? p.plane->Allreduce(in.data(), n, dt, op)
                       : p.plane->Allreduce(in.data(), out.data(), n, dt, op),
              what);
  CheckBytes(in_place ? in.data() : out.data(), Expected(n, dt, op, g_size, salt).data(), bytes,
             what);
  if (!in_place) CheckBytes(in.data(), original.data(), bytes, what + ": the input");
}

// The core's scaling around a plane's SUM: prescale the input, reduce,
// then FinishReduction (the postscale and, for AVERAGE, the division).
void CheckScaledAllreduce(PlaneUnderTest& p, int64_t n, DataType dt, ReduceOp op, double pre,
                          double post) {
  const int salt = ++g_salt;
  const int64_t bytes = n * DataTypeSize(dt);
  std::vector<char> buf = Filled(n, dt, g_rank, salt);
  const std::string what = Describe(p, "scaled allreduce", dt, op, n) + " pre " +
                           std::to_string(pre) + " post " + std::to_string(post);
  CheckStatus(ScaleBuffer(buf.data(), n, dt, pre), what);
  CheckStatus(p.plane->Allreduce(buf.data(), n, dt, ReduceOp::SUM), what);
  CheckStatus(FinishReduction(buf.data(), n, dt, op, post, g_size), what);
  std::vector<char> want = Filled(n, dt, 0, salt);
  ScaleBuffer(want.data(), n, dt, pre);
  for (int r = 1; r < g_size; ++r) {
    std::vector<char> other = Filled(n, dt, r, salt);
    ScaleBuffer(other.data(), n, dt, pre);
    ReduceInto(want.data(), other.data(), n, dt, ReduceOp::SUM);
  }
  FinishReduction(want.data(), n, dt, op, post, g_size);
  CheckBytes(buf.data(), want.data(), bytes, what);
}

void TestAllreduce(PlaneUnderTest& p) {
  for (DataType dt : kAllTypes) {
    const bool edges = RunsEdges(p, dt);
    for (ReduceOp op : kAllOps) {
      bool in_place = op == ReduceOp::SUM || op == ReduceOp::MAX;
      for (int64_t n : Counts(p, DataTypeSize(dt), edges)) {
        CheckAllreduce(p, n, dt, op, in_place);
        in_place = !in_place;
      }
    }
    if (dt == DataType::BOOL) continue;  // no scaling or average for bool
    for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVERAGE}) {
      for (auto scale : {std::make_pair(1.0, 1.0), std::make_pair(0.5, 4.0),
                         std::make_pair(3.0, 0.25)}) {
        for (int64_t n : {int64_t{1}, int64_t{1001}, p.step / DataTypeSize(dt) + 1}) {
          CheckScaledAllreduce(p, n, dt, op, scale.first, scale.second);
        }
      }
    }
  }
  // Planes with real-size pieces: float32 across many of them, up to the
  // ring's largest piece (1 MiB, from 4 MiB per rank's block).
  if (!p.every_type_at_edges) {
    for (int64_t n : {int64_t{262144 + 3}, int64_t{3} << 20}) {
      CheckAllreduce(p, n, DataType::FLOAT32, ReduceOp::SUM, true);
      CheckAllreduce(p, n, DataType::FLOAT32, ReduceOp::MAX, false);
    }
  }
  // An op that is not element-wise is refused, on every rank alike.
  float x = 1;
  CHECKF(!p.plane->Allreduce(&x, 1, DataType::FLOAT32, ReduceOp::ADASUM).ok(),
         "%s: an ADASUM allreduce must be refused", p.label.c_str());
}

void TestReducescatter(PlaneUnderTest& p) {
  const int size = g_size;
  for (DataType dt : kAllTypes) {
    const int64_t esize = DataTypeSize(dt);
    const int64_t c = RunsEdges(p, dt) ? std::max<int64_t>(p.step / esize, 1) : 13;
    std::vector<std::vector<int64_t>> layouts = {std::vector<int64_t>(size, 1),
                                                 std::vector<int64_t>(size, c),
                                                 std::vector<int64_t>(size, 0)};
    std::vector<int64_t> uneven, one_big(size, 0);
    for (int j = 0; j < size; ++j) uneven.push_back(j == 1 ? 0 : (j % 2 ? c + 1 : 2 * c + 5 - j));
    one_big[size - 1] = 3 * c + 7;
    layouts.push_back(uneven);
    layouts.push_back(one_big);
    for (ReduceOp op : kAllOps) {
      for (const auto& counts : layouts) {
        const int salt = ++g_salt;
        int64_t total = 0, before = 0;
        for (int j = 0; j < size; ++j) {
          if (j < g_rank) before += counts[j];
          total += counts[j];
        }
        std::vector<char> in = Filled(total, dt, g_rank, salt);
        std::vector<char> out(std::max<int64_t>(counts[g_rank] * esize, 1), 0x5a);
        const std::string what = Describe(p, "reducescatter", dt, op, total) + " share " +
                                 std::to_string(counts[g_rank]);
        CheckStatus(p.plane->Reducescatter(in.data(), out.data(), counts, dt, op), what);
        const std::vector<char> want = Expected(total, dt, op, size, salt);
        CheckBytes(out.data(), want.data() + before * esize, counts[g_rank] * esize, what);
      }
    }
  }
}

void TestAllgather(PlaneUnderTest& p) {
  const int size = g_size;
  const int64_t slot = size * p.step;
  std::vector<std::vector<int64_t>> layouts = {std::vector<int64_t>(size, 1),
                                               std::vector<int64_t>(size, 4),
                                               std::vector<int64_t>(size, 0),
                                               std::vector<int64_t>(size, slot + 1)};
  std::vector<int64_t> uneven, mixed;
  for (int j = 0; j < size; ++j) {
    uneven.push_back(j == 0 ? 0 : (j == 1 ? 3 * slot - 1 : 13 * j));
    mixed.push_back(j * slot + 3);
  }
  layouts.push_back(uneven);
  layouts.push_back(mixed);
  // Whole outputs around the single-copy cut-over, the last rank taking the
  // remainder.
  for (int64_t total : {p.single_copy_min - 1, p.single_copy_min, p.single_copy_min + 1}) {
    if (total <= 0) continue;
    std::vector<int64_t> around(size, total / size);
    around[size - 1] += total % size;
    layouts.push_back(around);
  }
  for (const auto& bytes : layouts) {
    const int salt = ++g_salt;
    int64_t total = 0, off = 0;
    for (int j = 0; j < size; ++j) {
      if (j < g_rank) off += bytes[j];
      total += bytes[j];
    }
    std::vector<char> want(std::max<int64_t>(total, 1));
    for (int j = 0, at = 0; j < size; at += bytes[j], ++j) FillBytes(want.data() + at, bytes[j], j, salt);
    std::vector<char> in(std::max<int64_t>(bytes[g_rank], 1));
    FillBytes(in.data(), bytes[g_rank], g_rank, salt);
    std::vector<char> out(std::max<int64_t>(total, 1), 0);
    const std::string what = p.label + " allgather of " + std::to_string(total) + " bytes";
    CheckStatus(p.plane->Allgather(in.data(), out.data(), bytes), what);
    CheckBytes(out.data(), want.data(), total, what);
    if (!p.allgathers_in_place) continue;
    // In place: the input already sits at this rank's place in the output.
    std::vector<char> inplace(std::max<int64_t>(total, 1), 0);
    FillBytes(inplace.data() + off, bytes[g_rank], g_rank, salt);
    CheckStatus(p.plane->Allgather(inplace.data() + off, inplace.data(), bytes), what + " in place");
    CheckBytes(inplace.data(), want.data(), total, what + " in place");
  }
}

void TestBroadcast(PlaneUnderTest& p) {
  const int size = g_size;
  const int64_t c = p.step;
  std::vector<int64_t> sizes = {0, 1, 1000};
  for (int64_t edge : {c, size * c, size * size * c, p.single_copy_min}) {
    if (edge <= 0) continue;
    for (int64_t v : {edge - 1, edge, edge + 1}) sizes.push_back(v);
  }
  for (int root = 0; root < size; ++root) {
    for (int64_t n : sizes) {
      const int salt = ++g_salt;
      const std::string what =
          p.label + " broadcast of " + std::to_string(n) + " bytes from " + std::to_string(root);
      std::vector<char> want(std::max<int64_t>(n, 1));
      FillBytes(want.data(), n, root, salt);
      std::vector<char> buf(std::max<int64_t>(n, 1), 0);
      if (g_rank == root) FillBytes(buf.data(), n, root, salt);
      CheckStatus(p.plane->Broadcast(buf.data(), n, root), what);
      CheckBytes(buf.data(), want.data(), n, what);
      if (!p.plane->broadcasts_out_of_place()) continue;
      // Out of place, as the TF op calls it: outputs start as garbage, the
      // root's input comes back untouched, the others' inputs are not read.
      std::vector<char> in(std::max<int64_t>(n, 1), 0x3c);
      if (g_rank == root) FillBytes(in.data(), n, root, salt);
      std::vector<char> out(std::max<int64_t>(n, 1), static_cast<char>(0xA5));
      CheckStatus(p.plane->BroadcastOutOfPlace(in.data(), out.data(), n, root),
                  what + " out of place");
      CheckBytes(out.data(), want.data(), n, what + " out of place");
      if (g_rank == root) CheckBytes(in.data(), want.data(), n, what + " out of place: the input");
    }
  }
}

// Bytes rank i sends to rank j in split `variant`.
int64_t PairBytes(int i, int j, int variant, int64_t step) {
  switch (variant) {
    case 0: return 8;
    case 1: return 0;
    case 2: return (i + 2 * j) % 3 == 0 ? 0 : (i * 5 + j) * step / 2 + i + j + 1;
    default: return i == 0 && j == 1 ? 4 * step + 3 : (i == j ? 17 : 0);  // one big pair
  }
}

void TestAlltoall(PlaneUnderTest& p) {
  const int size = g_size;
  for (int variant = 0; variant < 4; ++variant) {
    const int salt = ++g_salt;
    std::vector<int64_t> send(size), recv(size);
    int64_t send_total = 0, recv_total = 0;
    for (int j = 0; j < size; ++j) {
      send_total += send[j] = PairBytes(g_rank, j, variant, p.step);
      recv_total += recv[j] = PairBytes(j, g_rank, variant, p.step);
    }
    std::vector<char> in(std::max<int64_t>(send_total, 1)), want(std::max<int64_t>(recv_total, 1));
    for (int j = 0, s = 0, r = 0; j < size; s += send[j], r += recv[j], ++j) {
      FillBytes(in.data() + s, send[j], g_rank * 31 + j, salt);  // the block for j
      FillBytes(want.data() + r, recv[j], j * 31 + g_rank, salt);
    }
    std::vector<char> out(std::max<int64_t>(recv_total, 1), 0);
    const std::string what = p.label + " alltoall split " + std::to_string(variant);
    CheckStatus(p.plane->Alltoall(in.data(), send, out.data(), recv), what);
    CheckBytes(out.data(), want.data(), recv_total, what);
  }
  CheckStatus(p.plane->Barrier(), p.label + " barrier");
}

// Adasum has no simple serial reference: the same bits as MPI's plane on a
// power-of-two set, refused alike by both otherwise.
void TestAdasum(PlaneUnderTest& p, DataPlane& mpi) {
  if (!p.adasum) return;
  for (DataType dt : {DataType::FLOAT32, DataType::FLOAT64, DataType::FLOAT16}) {
    const std::vector<int64_t> tensors = {1, 0, 37, p.step / DataTypeSize(dt) + 5};
    int64_t total = 0;
    for (int64_t c : tensors) total += c;
    std::vector<char> a = Filled(total, dt, g_rank, ++g_salt), b = a;
    const Status sa = p.plane->Adasum(a.data(), tensors, dt);
    const Status sb = mpi.Adasum(b.data(), tensors, dt);
    const bool power_of_two = (g_size & (g_size - 1)) == 0;
    CHECKF(sa.ok() == sb.ok() && sa.ok() == power_of_two, "%s adasum %s: '%s', MPI's: '%s'",
           p.label.c_str(), DataTypeName(dt), sa.message().c_str(), sb.message().c_str());
    if (sa.ok() && sb.ok()) CheckBytes(a.data(), b.data(), total * DataTypeSize(dt), p.label + " adasum vs MPI");
  }
}

// Collective: a TCP world over loopback, its addresses swapped through MPI.
Status ConnectTcp(std::shared_ptr<Communicator>* world) {
  std::unique_ptr<tcp::TcpListener> listener;
  TFRING_RETURN_IF_ERROR(tcp::TcpListener::Open("127.0.0.1", 0, &listener));
  constexpr int kAddr = 64;
  char mine[kAddr] = {};
  std::snprintf(mine, kAddr, "%s", listener->address().c_str());
  std::vector<char> all(kAddr * g_size);
  MPI_Allgather(mine, kAddr, MPI_CHAR, all.data(), kAddr, MPI_CHAR, MPI_COMM_WORLD);
  std::vector<tcp::TcpPeer> peers;
  for (int r = 0; r < g_size; ++r) peers.push_back({std::string(&all[r * kAddr]), "localhost"});
  tcp::TcpOptions options;
  options.secret = "0123456789abcdef0123456789abcdef";
  return tcp::ConnectTcpWorld(g_rank, peers, std::move(listener), options, world);
}

// The shm plane's chunk when left to choose: a 512 KiB slot split among the
// ranks, rounded up to 4 KiB (shm_data_plane.cc).
int64_t DefaultShmChunk() { return ((512 * 1024 / g_size) + 4095) / 4096 * 4096; }

// Every plane under test, each with its thresholds. Collective: every rank
// makes the same planes in the same order.
std::vector<PlaneUnderTest> MakePlanes(const std::shared_ptr<MPICommunicator>& comm,
                                       DataPlane* mpi, const std::shared_ptr<Communicator>& tcp) {
  std::vector<PlaneUnderTest> planes;
  auto add = [&](PlaneUnderTest p, const Status& s) {
    CHECKF(s.ok(), "creating %s: %s", p.label.c_str(), s.message().c_str());
    if (s.ok()) planes.push_back(std::move(p));
  };
  std::vector<std::string> hosts;  // the first half of the ranks on one fake host
  for (int i = 0; i < g_size; ++i) hosts.push_back(i < (g_size + 1) / 2 ? "a" : "b");
  ring_internal::RingOptions tiny;  // a few elements per piece: many pieces and windows
  tiny.segment_bytes = 40;
  tiny.window = 2;
  for (int v = 0; v < 3; ++v) {
    // Default tuning; 4 KiB chunks with a 4 KiB one-step path; 4 KiB chunks
    // and single copy from 8 KiB (where the system lets ranks read each
    // other's memory; the ranks agree, so it may be off on all).
    ShmOptions opts;
    PlaneUnderTest p{v == 0 ? "shm" : (v == 1 ? "shm/4k-chunks" : "shm/single-copy")};
    if (v > 0) opts.chunk_bytes = p.step = 4096;
    if (v == 1) opts.small_allreduce_bytes = p.small = 4096;
    if (v == 2) {
      opts.small_allreduce_bytes = 0;
      opts.single_copy = true;
      opts.single_copy_min_bytes = 8192;
    }
    if (v == 0) {
      p.step = DefaultShmChunk();
      p.small = 64 * 1024;
      p.every_type_at_edges = false;
    }
    Status s = CreateShmDataPlane(g_rank, g_size, mpi, nullptr, opts, &p.plane);
    if (s.ok() && ShmSingleCopy(*p.plane)) p.single_copy_min = 8192;
    if (s.ok() && v == 2 && g_rank == 0) {
      std::printf("shm/single-copy: single copy %s\n", p.single_copy_min > 0 ? "on" : "off");
    }
    add(std::move(p), s);
  }
  // The ring-based planes, each with its default pieces (growing from 64 KiB,
  // below 4 x 64 KiB per block, to 1 MiB) and with tiny ones.
  auto add_ring = [&](const std::string& label, const std::shared_ptr<Communicator>& on,
                      bool hierarchical) {
    for (bool small_pieces : {false, true}) {
      PlaneUnderTest p{small_pieces ? label + "/tiny-pieces" : label};
      ring_internal::RingOptions options;
      if (small_pieces) options = tiny;
      p.step = small_pieces ? tiny.segment_bytes : 64 * 1024;
      p.every_type_at_edges = small_pieces;
      p.adasum = true;
      const Status s =
          hierarchical ? ring_internal::CreateHierarchicalDataPlane(on, hosts, options, &p.plane)
                       : ring_internal::CreateRingDataPlane(on, true, options, &p.plane);
      add(std::move(p), s);
    }
  };
  add_ring("ring", comm, false);
  add_ring("hierarchical", comm, true);
  if (tcp) add_ring("ring-tcp", tcp, false);
  // The ring plane with each allreduce algorithm forced (the planes above
  // choose by the measured model; these run one whatever the size), over
  // MPI and over TCP. Their results are compared bit for bit with the
  // serial reference like every plane's: plane_data.h's values keep every
  // reduction order exact up to 4 ranks. Powers of two beyond 2 and the
  // fold of larger non-powers are allreduce_algorithms_test.cc's (worlds of
  // up to 8 ranks on threads).
  for (auto algorithm :
       {AllreduceAlgorithm::RECURSIVE_DOUBLING, AllreduceAlgorithm::RABENSEIFNER}) {
    const std::string suffix = algorithm == AllreduceAlgorithm::RECURSIVE_DOUBLING
                                   ? "/recursive-doubling"
                                   : "/rabenseifner";
    const std::shared_ptr<Communicator> over_mpi = comm;
    for (const auto& on : {std::make_pair(std::string("ring"), over_mpi),
                           std::make_pair(std::string("ring-tcp"), tcp)}) {
      if (!on.second) continue;
      PlaneUnderTest p{on.first + suffix};
      ring_internal::RingOptions options;
      options.allreduce = algorithm;
      p.step = 4096;
      p.allreduce_only = true;
      const Status s = ring_internal::CreateRingDataPlane(on.second, true, options, &p.plane);
      add(std::move(p), s);
    }
  }
  return planes;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  g_check_rank = g_rank;
  InitMPITypes();
  std::vector<std::string> only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--debug") SetLogging(LogLevel::DEBUG, false, g_rank);
    if (a == "--plane" && i + 1 < argc) only.push_back(argv[++i]);
  }
  MPI_Comm dup;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  int failed = 0;
  {
    auto comm = std::make_shared<MPICommunicator>(dup);
    PlaneUnderTest mpi{"mpi", std::make_unique<MPIDataPlane>(comm)};
    mpi.allgathers_in_place = false;
    std::shared_ptr<Communicator> tcp;
    Status s = ConnectTcp(&tcp);
    CHECKF(s.ok(), "connecting the TCP world: %s", s.message().c_str());
    if (!s.ok()) tcp.reset();
    std::vector<PlaneUnderTest> planes = MakePlanes(comm, mpi.plane.get(), tcp);
    std::vector<PlaneUnderTest*> all = {&mpi};
    for (auto& p : planes) all.push_back(&p);
    std::printf("[%d] conformance set-up: %d checks, %d failed\n", g_rank, g_checks, g_failures);
    failed += g_failures;
    for (PlaneUnderTest* p : all) {
      if (!only.empty() && std::find(only.begin(), only.end(), p->label) == only.end()) continue;
      g_checks = g_failures = 0;
      const auto t0 = std::chrono::steady_clock::now();
      TestAllreduce(*p);
      if (!p->allreduce_only) {
        TestReducescatter(*p);
        TestAllgather(*p);
        TestBroadcast(*p);
        TestAlltoall(*p);
        TestAdasum(*p, *mpi.plane);
      }
      const std::chrono::duration<double> took = std::chrono::steady_clock::now() - t0;
      std::printf("[%d] conformance %s: %d checks, %d failed (%.1f s)\n", g_rank,
                  p->label.c_str(), g_checks, g_failures, took.count());
      std::fflush(stdout);
      failed += g_failures;
    }
    planes.clear();
  }
  int total = 0;
  MPI_Allreduce(&failed, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  FreeMPITypes();
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
