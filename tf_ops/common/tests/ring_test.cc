// MPI test of the ring and hierarchical data planes without TensorFlow, the
// planes built on an MPICommunicator (they see only the Communicator
// interface): every collective, dtype and reduce op at sizes around the piece
// size (also with tiny pieces, so the pipeline runs through many pieces and
// windows), compared byte for byte with the reduction computed locally (and,
// for the default ring, with the MPI data plane); alltoall and Adasum
// against the MPI data plane.
// Built with mpicxx and run with mpiexec by tests/common/ops/test_ring_data_plane.py.
//
//   ring_test [--hosts a,a,b] [--debug] [--bench [--segment BYTES] [--window N]]
//
// --hosts gives the fake host of every rank for the hierarchical plane
// (default: the first half of the ranks on one host, the rest on another).
// --bench times float32 allreduce on each plane instead of testing.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../logging.h"
#include "../ops/mpi_data_plane.h"
#include "../ops/ring_data_plane.h"
#include "../reduction.h"

using namespace tfring;

static int g_checks = 0, g_failures = 0, g_rank = 0;

#define CHECK_OK(expr, what)                                                                \
  do {                                                                                      \
    ++g_checks;                                                                             \
    Status _s = (expr);                                                                     \
    if (!_s.ok()) {                                                                         \
      ++g_failures;                                                                         \
      std::fprintf(stderr, "[%d] %s: %s failed: %s\n", g_rank, (what).c_str(), #expr,       \
                   _s.message().c_str());                                                   \
    }                                                                                       \
  } while (0)

static void CheckSame(const std::vector<char>& got, const std::vector<char>& want,
                      const std::string& what) {
  ++g_checks;
  if (got.size() != want.size() || std::memcmp(got.data(), want.data(), got.size()) != 0) {
    ++g_failures;
    size_t i = 0;
    while (i < std::min(got.size(), want.size()) && got[i] == want[i]) ++i;
    std::fprintf(stderr,
                 "[%d] %s: results differ from the expected ones (%zu vs %zu bytes, first at "
                 "byte %zu)\n",
                 g_rank, what.c_str(), got.size(), want.size(), i);
  }
}

static const DataType kTypes[] = {DataType::UINT8,   DataType::INT8,     DataType::UINT16,
                                  DataType::INT16,   DataType::INT32,    DataType::INT64,
                                  DataType::FLOAT16, DataType::BFLOAT16, DataType::FLOAT32,
                                  DataType::FLOAT64, DataType::BOOL};
static const ReduceOp kOps[] = {ReduceOp::SUM, ReduceOp::MIN, ReduceOp::MAX, ReduceOp::PRODUCT};

// Small integers, exact in every dtype (products over 4 ranks fit in int8).
static void Fill(std::vector<char>* buf, int64_t count, DataType dtype, int rank, int salt) {
  buf->assign(count * DataTypeSize(dtype), 0);
  for (int64_t i = 0; i < count; ++i) {
    const int v = 1 + static_cast<int>((i * 7 + rank + salt) % 3);
    char* p = buf->data() + i * DataTypeSize(dtype);
    switch (dtype) {
      case DataType::UINT8: *reinterpret_cast<uint8_t*>(p) = v; break;
      case DataType::INT8:
        *reinterpret_cast<int8_t*>(p) = static_cast<int8_t>(rank % 2 ? -v : v);
        break;
      case DataType::UINT16: *reinterpret_cast<uint16_t*>(p) = v; break;
      case DataType::INT16: *reinterpret_cast<int16_t*>(p) = v; break;
      case DataType::INT32: *reinterpret_cast<int32_t*>(p) = rank % 2 ? -v : v; break;
      case DataType::INT64: *reinterpret_cast<int64_t*>(p) = v; break;
      case DataType::FLOAT16:
        *reinterpret_cast<uint16_t*>(p) = FloatToHalf(static_cast<float>(v));
        break;
      case DataType::BFLOAT16:
        *reinterpret_cast<uint16_t*>(p) = FloatToBFloat16(static_cast<float>(v));
        break;
      case DataType::FLOAT32: *reinterpret_cast<float*>(p) = v * 0.5f; break;
      case DataType::FLOAT64: *reinterpret_cast<double*>(p) = v * 0.25; break;
      case DataType::BOOL: *reinterpret_cast<uint8_t*>(p) = (i + rank) % 2; break;
    }
  }
}

// What the reduction of every rank's Fill() gives, computed locally (exact:
// small integers), so that checking a plane costs no MPI collective, which
// crawls when ranks outnumber cores.
static std::vector<char> Reduced(int64_t count, DataType dtype, ReduceOp op, int size, int salt) {
  std::vector<char> acc, other;
  Fill(&acc, count, dtype, 0, salt);
  for (int r = 1; r < size; ++r) {
    Fill(&other, count, dtype, r, salt);
    ReduceInto(acc.data(), other.data(), count, dtype, op);
  }
  return acc;
}

struct Named {
  std::string name;
  std::unique_ptr<DataPlane> plane;
};

// `big` adds the sizes that make many pieces (skipped with tiny pieces).
// `big` adds the sizes that make many pieces (skipped with tiny pieces).
// `cross_check` also compares the small allreduces with the MPI plane.
static void TestPlane(Named& t, DataPlane& mpi, int rank, int size, bool big, bool cross_check) {
  // Allreduce: every dtype and op at small and odd sizes, float32 also
  // across many pieces.
  std::vector<int64_t> counts = {0, 1, 2, size - 1, size, size + 1, 7, 13, 100, 1001, 4097};
  for (DataType dt : kTypes) {
    for (ReduceOp op : kOps) {
      for (int64_t c : counts) {
        if (c < 0 || (!big && c > 1001)) continue;
        std::vector<char> a;
        Fill(&a, c, dt, rank, 0);
        std::vector<char> b = a;
        std::string what = t.name + " allreduce " + DataTypeName(dt) + " " + ReduceOpName(op) +
                           " count " + std::to_string(c);
        CHECK_OK(t.plane->Allreduce(a.data(), c, dt, op), what);
        CheckSame(a, Reduced(c, dt, op, size, 0), what);
        {
          // Out of place: into a garbage output, the input left as it was.
          std::vector<char> in = b, out(b.size(), static_cast<char>(0xA5));
          CHECK_OK(t.plane->Allreduce(in.data(), out.data(), c, dt, op), what + " out of place");
          CheckSame(out, Reduced(c, dt, op, size, 0), what + " out of place");
          CheckSame(in, b, what + " out of place: the input");
        }
        if (cross_check) {
          CHECK_OK(mpi.Allreduce(b.data(), c, dt, op), what + " (MPI)");
          CheckSame(a, b, what + " vs MPI");
        }
      }
    }
  }
  for (int64_t c : {int64_t{65535}, int64_t{262144 + 3}, int64_t{1 << 20}, int64_t{3 << 20}}) {
    if (!big && c > 65535) continue;
    for (ReduceOp op : {ReduceOp::SUM, ReduceOp::MAX}) {
      std::vector<char> a;
      Fill(&a, c, DataType::FLOAT32, rank, 1);
      std::string what = t.name + " allreduce float32 " + ReduceOpName(op) + " count " +
                         std::to_string(c);
      if (op == ReduceOp::MAX) {  // out of place, across many pieces
        std::vector<char> out(a.size(), static_cast<char>(0xA5));
        const std::vector<char> before = a;
        CHECK_OK(t.plane->Allreduce(a.data(), out.data(), c, DataType::FLOAT32, op), what);
        CheckSame(a, before, what + " out of place: the input");
        a.swap(out);
      } else {
        CHECK_OK(t.plane->Allreduce(a.data(), c, DataType::FLOAT32, op), what);
      }
      CheckSame(a, Reduced(c, DataType::FLOAT32, op, size, 1), what);
    }
  }
  // Allgather with different sizes per rank (some empty).
  for (int salt : {0, 1, 5}) {
    for (int64_t scale : {int64_t{1}, int64_t{1000}, int64_t{100003}}) {
      if (!big && scale > 1000) continue;
      std::vector<int64_t> bytes(size);
      int64_t total = 0;
      for (int i = 0; i < size; ++i) total += bytes[i] = ((i * 3 + salt) % 4) * scale;
      std::vector<char> mine, want, block;
      for (int r = 0; r < size; ++r) {
        Fill(&block, bytes[r], DataType::UINT8, r, salt);
        want.insert(want.end(), block.begin(), block.end());
        if (r == rank) mine = block;
      }
      std::vector<char> a(total, 0);
      std::string what = t.name + " allgather salt " + std::to_string(salt) + " scale " +
                         std::to_string(scale);
      CHECK_OK(t.plane->Allgather(mine.data(), a.data(), bytes), what);
      CheckSame(a, want, what);
    }
  }
  // Broadcast from every root.
  for (int root = 0; root < size; ++root) {
    for (int64_t bytes : {int64_t{0}, int64_t{1}, int64_t{1000}, int64_t{(1 << 20) + 3}}) {
      if (!big && bytes > 1000) continue;
      std::vector<char> a, want;
      Fill(&a, bytes, DataType::UINT8, rank == root ? 7 : rank, 0);
      Fill(&want, bytes, DataType::UINT8, 7, 0);
      std::string what = t.name + " broadcast root " + std::to_string(root) + " bytes " +
                         std::to_string(bytes);
      CHECK_OK(t.plane->Broadcast(a.data(), bytes, root), what);
      CheckSame(a, want, what);
    }
  }
  // Reducescatter with uneven (and empty) shares.
  for (DataType dt : {DataType::FLOAT32, DataType::INT64, DataType::FLOAT16, DataType::BOOL}) {
    for (ReduceOp op : kOps) {
      for (int64_t scale : {int64_t{1}, int64_t{37}, int64_t{70001}}) {
        if (!big && scale > 37) continue;
        std::vector<int64_t> rc(size);
        int64_t total = 0, begin = 0;
        for (int i = 0; i < size; ++i) {
          if (i == rank) begin = total;
          total += rc[i] = ((i * 5 + 2) % 4) * scale;
        }
        std::vector<char> in;
        Fill(&in, total, dt, rank, 2);
        const int64_t es = DataTypeSize(dt);
        std::vector<char> full = Reduced(total, dt, op, size, 2);
        std::vector<char> want(full.begin() + begin * es, full.begin() + (begin + rc[rank]) * es);
        std::vector<char> a(rc[rank] * es, 0);
        std::string what = t.name + " reducescatter " + DataTypeName(dt) + " " +
                           ReduceOpName(op) + " scale " + std::to_string(scale);
        CHECK_OK(t.plane->Reducescatter(in.data(), a.data(), rc, dt, op), what);
        CheckSame(a, want, what);
      }
    }
  }
  // Alltoall (pairwise messages) and barrier against the MPI plane's.
  for (int scale : {1, 1000, 70001}) {
    if (!big && scale > 1000) continue;
    std::vector<int64_t> sb(size), rb(size);
    int64_t st = 0, rt = 0;
    for (int j = 0; j < size; ++j) {
      // Some blocks empty: ((rank + j) % 3) is 0 for some pairs.
      st += sb[j] = ((rank + j) % 3) * scale;
      rt += rb[j] = ((j + rank) % 3) * scale;
    }
    std::vector<char> in;
    Fill(&in, st, DataType::UINT8, rank, 0);
    std::vector<char> a(rt), b(rt);
    std::string what = t.name + " alltoall scale " + std::to_string(scale);
    CHECK_OK(t.plane->Alltoall(in.data(), sb, a.data(), rb), what);
    CHECK_OK(mpi.Alltoall(in.data(), sb, b.data(), rb), what);
    CheckSame(a, b, what);
    CHECK_OK(t.plane->Barrier(), t.name + " barrier");
  }
  // Adasum: the same bits as the MPI plane's on a power-of-two set; refused
  // (on every rank alike) otherwise.
  for (DataType dt : {DataType::FLOAT32, DataType::FLOAT64, DataType::FLOAT16}) {
    std::vector<int64_t> tensors = {1, 0, 37, big ? 50001 : 501};
    int64_t total = 0;
    for (int64_t c : tensors) total += c;
    std::vector<char> a;
    Fill(&a, total, dt, rank, 3);
    std::vector<char> b = a;
    std::string what = t.name + " adasum " + DataTypeName(dt);
    Status sa = t.plane->Adasum(a.data(), tensors, dt);
    Status sb = mpi.Adasum(b.data(), tensors, dt);
    ++g_checks;
    if (sa.ok() != sb.ok() || sa.ok() != ((size & (size - 1)) == 0)) {
      ++g_failures;
      std::fprintf(stderr, "[%d] %s: plane says '%s', MPI plane says '%s'\n", rank, what.c_str(),
                   sa.message().c_str(), sb.message().c_str());
    } else if (sa.ok()) {
      CheckSame(a, b, what + " vs MPI");
    }
  }
  // Unsupported op: an error, not a crash, on every rank alike.
  {
    std::vector<char> a(16);
    ++g_checks;
    if (t.plane->Allreduce(a.data(), 4, DataType::FLOAT32, ReduceOp::ADASUM).ok()) {
      ++g_failures;
      std::fprintf(stderr, "[%d] %s: ADASUM should be refused\n", rank, t.name.c_str());
    }
  }
}

static double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

static void Bench(std::vector<Named>& planes, DataPlane& mpi, int rank, int size) {
  for (int64_t bytes :
       {int64_t{64} << 10, int64_t{1} << 20, int64_t{16} << 20, int64_t{64} << 20}) {
    const int64_t count = bytes / 4;
    std::vector<float> buf(count, 1.0f);
    auto time_plane = [&](DataPlane* p) {
      std::vector<double> ts;
      const int reps = bytes >= (16 << 20) ? 7 : 30;
      for (int i = 0; i < reps + 2; ++i) {
        MPI_Barrier(MPI_COMM_WORLD);
        auto t0 = std::chrono::steady_clock::now();
        Status s = p->Allreduce(buf.data(), count, DataType::FLOAT32, ReduceOp::SUM);
        auto t1 = std::chrono::steady_clock::now();
        if (!s.ok()) std::fprintf(stderr, "%s\n", s.message().c_str());
        if (i >= 2) ts.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      }
      // The slowest rank's median decides.
      double m = Median(ts), worst = 0;
      MPI_Allreduce(&m, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      return worst;
    };
    double t_mpi = time_plane(&mpi);
    if (rank == 0) std::printf("%9lld bytes  MPI %9.3f ms", static_cast<long long>(bytes), t_mpi);
    for (Named& t : planes) {
      double tp = time_plane(t.plane.get());
      if (rank == 0) std::printf("  %s %9.3f ms", t.name.c_str(), tp);
    }
    if (rank == 0) std::printf("\n");
    std::fflush(stdout);
  }
  (void)size;
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  g_rank = rank;
  InitMPITypes();
  std::string hosts_arg;
  bool bench = false;
  ring_internal::RingOptions bench_opt;  // --segment/--window: pieces of the timed planes
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--hosts" && i + 1 < argc) hosts_arg = argv[++i];
    if (a == "--bench") bench = true;
    if (a == "--debug") SetLogging(LogLevel::DEBUG, false, rank);
    if (a == "--segment" && i + 1 < argc) bench_opt.segment_bytes = std::atoll(argv[++i]);
    if (a == "--window" && i + 1 < argc) bench_opt.window = std::atoi(argv[++i]);
  }
  std::vector<std::string> hosts;
  if (!hosts_arg.empty()) {
    size_t start = 0;
    while (true) {
      size_t comma = hosts_arg.find(',', start);
      hosts.push_back(hosts_arg.substr(start, comma - start));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  } else {
    for (int i = 0; i < size; ++i) hosts.push_back(i < (size + 1) / 2 ? "a" : "b");
  }
  if (static_cast<int>(hosts.size()) != size) {
    if (rank == 0) std::fprintf(stderr, "--hosts needs %d names\n", size);
    MPI_Finalize();
    return 2;
  }

  MPI_Comm dup;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  auto comm = std::make_shared<MPICommunicator>(dup);
  MPIDataPlane mpi(comm);

  std::vector<Named> planes;
  auto add = [&](const std::string& name, Status s, std::unique_ptr<DataPlane> p) {
    ++g_checks;
    if (!s.ok()) {
      ++g_failures;
      std::fprintf(stderr, "[%d] creating %s: %s\n", rank, name.c_str(), s.message().c_str());
      return;
    }
    planes.push_back({name, std::move(p)});
  };
  {
    std::unique_ptr<DataPlane> p;
    Status s = ring_internal::CreateRingDataPlane(comm, true, bench_opt, &p);
    add("ring", s, std::move(p));
  }
  if (!bench) {
    ring_internal::RingOptions tiny;
    tiny.segment_bytes = 40;  // a few elements per piece (rounded down per dtype)
    tiny.window = 2;
    std::unique_ptr<DataPlane> p;
    Status s = ring_internal::CreateRingDataPlane(comm, true, tiny, &p);
    add("ring(tiny pieces)", s, std::move(p));
    ring_internal::RingOptions wide;
    wide.segment_bytes = 4096;
    wide.window = 16;
    s = ring_internal::CreateRingDataPlane(comm, true, wide, &p);
    add("ring(4k pieces, window 16)", s, std::move(p));
  }
  {
    std::unique_ptr<DataPlane> p;
    Status s = ring_internal::CreateHierarchicalDataPlane(comm, hosts, bench_opt, &p);
    add("hierarchical(" + hosts_arg + ")", s, std::move(p));
  }
  if (!bench) {
    ring_internal::RingOptions tiny;
    tiny.segment_bytes = 24;
    std::unique_ptr<DataPlane> p;
    Status s = ring_internal::CreateHierarchicalDataPlane(comm, hosts, tiny, &p);
    add("hierarchical(tiny pieces)", s, std::move(p));
  }

  if (bench) {
    Bench(planes, mpi, rank, size);
  } else {
    for (Named& t : planes) {
      auto t0 = std::chrono::steady_clock::now();
      TestPlane(t, mpi, rank, size, t.name.find("tiny") == std::string::npos, t.name == "ring");
      std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
      if (rank == 0) std::printf("%s: %.1f s\n", t.name.c_str(), dt.count());
    }
  }
  planes.clear();
  int failures = g_failures, total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (!bench) std::printf("[%d] ring_test: %d checks, %d failed\n", rank, g_checks, g_failures);
  comm.reset();
  FreeMPITypes();
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
