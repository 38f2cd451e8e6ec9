// The element-wise kernels of gpu_kernels.h compiled at run time with NVRTC,
// so that a GPU build needs g++ and the CUDA runtime headers only, not nvcc
// (NVIDIA's CUDA 12 pip wheels ship no nvcc). Compiled into a GPU build made
// without nvcc (TFRING_NVRTC_KERNELS); gpu_kernels.cu is the nvcc variant,
// with the same semantics.
//
// NVRTC is opened with dlopen when the first kernel is needed, beside the
// CUDA runtime this library runs with (the pip wheels' layout), then by its
// soname, so loading tfring never needs it. Each GPU architecture in use
// gets its own cubin, made once and loaded with cudaLibraryLoadData.
#if defined(TFRING_WITH_NCCL) && defined(TFRING_NVRTC_KERNELS)

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "../../logging.h"
#include "gpu_kernels.h"

namespace tfring {
namespace cuda {
namespace {

// The kernels, written against no header at all: 16-bit floats convert
// through PTX (half) and bit arithmetic (bfloat16, round to nearest even as
// reduction.cc), so that NVRTC needs no include path.
const char* const kSource = R"CUDA(
typedef unsigned short u16;
typedef long long i64;
__device__ float h2f(u16 h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ u16 f2h(float f) { u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ float b2f(u16 b) { return __uint_as_float(((unsigned)b) << 16); }
__device__ u16 f2b(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (u16)(u >> 16);
}
#define LOOP for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)blockDim.x * gridDim.x)
#define SCALE(name, T) \
  extern "C" __global__ void scale_##name(T* d, const T* s, i64 n, double f) { LOOP d[i] = (T)((double)s[i] * f); } \
  extern "C" __global__ void divide_##name(T* b, i64 n, i64 q) { LOOP b[i] = (T)(b[i] / (T)q); }
SCALE(f32, float) SCALE(f64, double) SCALE(i8, signed char) SCALE(u8, unsigned char)
SCALE(i16, short) SCALE(u16, unsigned short) SCALE(i32, int) SCALE(i64, long long)
extern "C" __global__ void scale_f16(u16* d, const u16* s, i64 n, double f) { LOOP d[i] = f2h((float)((double)h2f(s[i]) * f)); }
extern "C" __global__ void scale_bf16(u16* d, const u16* s, i64 n, double f) { LOOP d[i] = f2b((float)((double)b2f(s[i]) * f)); }
extern "C" __global__ void divide_f16(u16* b, i64 n, i64 q) { LOOP b[i] = f2h(h2f(b[i]) / (float)q); }
extern "C" __global__ void divide_bf16(u16* b, i64 n, i64 q) { LOOP b[i] = f2b(b2f(b[i]) / (float)q); }
struct CopyBatch { char* dst[64]; const char* src[64]; i64 bytes[64]; };
struct alignas(16) v16 { unsigned long long a, b; };
extern "C" __global__ void copy_batch(CopyBatch batch) {
  char* dst = batch.dst[blockIdx.y];
  const char* src = batch.src[blockIdx.y];
  const i64 bytes = batch.bytes[blockIdx.y];
  const i64 start = blockIdx.x * (i64)blockDim.x + threadIdx.x, step = (i64)blockDim.x * gridDim.x;
  i64 done = 0;
  if ((((unsigned long long)dst | (unsigned long long)src) & 15) == 0) {
    const i64 vectors = bytes / 16;
    for (i64 i = start; i < vectors; i += step) ((v16*)dst)[i] = ((const v16*)src)[i];
    done = vectors * 16;
  }
  for (i64 i = done + start; i < bytes; i += step) dst[i] = src[i];
}
)CUDA";

const char* Suffix(DataType dtype) {
  switch (dtype) {
    case DataType::FLOAT32: return "f32";
    case DataType::FLOAT64: return "f64";
    case DataType::FLOAT16: return "f16";
    case DataType::BFLOAT16: return "bf16";
    case DataType::INT8: return "i8";
    case DataType::UINT8: return "u8";
    case DataType::INT16: return "i16";
    case DataType::UINT16: return "u16";
    case DataType::INT32: return "i32";
    case DataType::INT64: return "i64";
    case DataType::BOOL: break;
  }
  return nullptr;
}

// NVRTC's C API (nvrtc.h), the few calls used.
using nvrtcProgram = void*;
struct Nvrtc {
  int (*create)(nvrtcProgram*, const char*, const char*, int, const char* const*,
                const char* const*) = nullptr;
  int (*compile)(nvrtcProgram, int, const char* const*) = nullptr;
  int (*cubin_size)(nvrtcProgram, size_t*) = nullptr;
  int (*cubin)(nvrtcProgram, char*) = nullptr;
  int (*log_size)(nvrtcProgram, size_t*) = nullptr;
  int (*log)(nvrtcProgram, char*) = nullptr;
  int (*destroy)(nvrtcProgram*) = nullptr;
  std::string error;  // why NVRTC could not be loaded
};

// Where to look for libnvrtc: $TFRING_NVRTC_LIBRARY; beside the CUDA runtime
// in use (pip wheels: nvidia/cuda_runtime/lib next to nvidia/cuda_nvrtc/lib;
// a toolkit: the same lib64); then the loader's own search.
std::vector<std::string> Candidates() {
  const std::string soname = "libnvrtc.so." + std::to_string(CUDART_VERSION / 1000);
  std::vector<std::string> c;
  if (const char* env = std::getenv("TFRING_NVRTC_LIBRARY")) c.push_back(env);
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&cudaGetDeviceCount), &info) && info.dli_fname) {
    std::string dir(info.dli_fname);
    dir = dir.substr(0, dir.rfind('/'));
    c.push_back(dir + "/" + soname);
    c.push_back(dir + "/../../cuda_nvrtc/lib/" + soname);
    c.push_back(dir + "/../../cu" + std::to_string(CUDART_VERSION / 1000) + "/lib/" + soname);
  }
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"}) {
    if (const char* home = std::getenv(var)) c.push_back(std::string(home) + "/lib64/" + soname);
  }
  c.push_back("/usr/local/cuda/lib64/" + soname);  // a toolkit's usual place
  c.push_back(soname);
  c.push_back("libnvrtc.so");
  return c;
}

const Nvrtc& LoadNvrtc() {
  static Nvrtc* api = [] {
    auto* n = new Nvrtc();
    void* lib = nullptr;
    std::string tried;
    for (const std::string& path : Candidates()) {
      lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib) break;
      tried += (tried.empty() ? "" : ", ") + path;
    }
    if (!lib) {
      n->error = "NVRTC (libnvrtc) was not found (tried " + tried +
                 "); install nvidia-cuda-nvrtc-cu12 or set TFRING_NVRTC_LIBRARY";
      return n;
    }
    n->create = reinterpret_cast<decltype(n->create)>(dlsym(lib, "nvrtcCreateProgram"));
    n->compile = reinterpret_cast<decltype(n->compile)>(dlsym(lib, "nvrtcCompileProgram"));
    n->cubin_size = reinterpret_cast<decltype(n->cubin_size)>(dlsym(lib, "nvrtcGetCUBINSize"));
    n->cubin = reinterpret_cast<decltype(n->cubin)>(dlsym(lib, "nvrtcGetCUBIN"));
    n->log_size = reinterpret_cast<decltype(n->log_size)>(dlsym(lib, "nvrtcGetProgramLogSize"));
    n->log = reinterpret_cast<decltype(n->log)>(dlsym(lib, "nvrtcGetProgramLog"));
    n->destroy = reinterpret_cast<decltype(n->destroy)>(dlsym(lib, "nvrtcDestroyProgram"));
    if (!n->create || !n->compile || !n->cubin_size || !n->cubin || !n->log_size || !n->log ||
        !n->destroy) {
      n->error = "libnvrtc lacks a function tfring needs (nvrtcGetCUBIN needs NVRTC 11.1 or later)";
      n->create = nullptr;
    }
    return n;
  }();
  return *api;
}

// One compiled library per compute capability.
struct Compiled {
  cudaLibrary_t library = nullptr;
  std::map<std::string, cudaKernel_t> kernels;
};

// cudaErrorInvalidKernelImage-like failure, logged once with its reason.
int Fail(const std::string& why) {
  static std::once_flag logged;
  std::call_once(logged, [&] { TFRING_LOG(ERROR) << "tfring's GPU kernels: " << why; });
  return static_cast<int>(cudaErrorInvalidKernelImage);
}

int KernelFor(const std::string& name, cudaKernel_t* out) {
  static std::mutex mu;
  static std::map<int, Compiled>* by_arch = new std::map<int, Compiled>();
  int device = 0, major = 0, minor = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (e != cudaSuccess) return static_cast<int>(e);
  const int arch = major * 10 + minor;
  std::lock_guard<std::mutex> lock(mu);
  Compiled& c = (*by_arch)[arch];
  if (!c.library) {
    const Nvrtc& nv = LoadNvrtc();
    if (!nv.create) return Fail(nv.error);
    nvrtcProgram prog = nullptr;
    if (nv.create(&prog, kSource, "tfring_kernels.cu", 0, nullptr, nullptr) != 0) {
      return Fail("nvrtcCreateProgram failed");
    }
    const std::string gpu = "--gpu-architecture=sm_" + std::to_string(arch);
    const char* options[] = {gpu.c_str()};
    const int compiled = nv.compile(prog, 1, options);
    size_t size = 0;
    std::string log;
    if (nv.log_size(prog, &size) == 0 && size > 1) {
      log.resize(size);
      nv.log(prog, &log[0]);
    }
    std::vector<char> cubin;
    if (compiled == 0 && nv.cubin_size(prog, &size) == 0) {
      cubin.resize(size);
      if (nv.cubin(prog, cubin.data()) != 0) cubin.clear();
    }
    nv.destroy(&prog);
    if (cubin.empty()) {
      return Fail("NVRTC could not compile them for sm_" + std::to_string(arch) + ": " + log);
    }
    e = cudaLibraryLoadData(&c.library, cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
    if (e != cudaSuccess) {
      c.library = nullptr;
      return static_cast<int>(e);
    }
  }
  auto it = c.kernels.find(name);
  if (it == c.kernels.end()) {
    cudaKernel_t k = nullptr;
    e = cudaLibraryGetKernel(&k, c.library, name.c_str());
    if (e != cudaSuccess) return static_cast<int>(e);
    it = c.kernels.emplace(name, k).first;
  }
  *out = it->second;
  return 0;
}

constexpr int kThreads = 256;
unsigned Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 4096 ? (b < 1 ? 1 : b) : 4096);
}

int Launch(const std::string& name, int64_t n, void** args, void* stream) {
  cudaKernel_t k = nullptr;
  int err = KernelFor(name, &k);
  if (err != 0) return err;
  return static_cast<int>(cudaLaunchKernel(reinterpret_cast<const void*>(k), dim3(Blocks(n)),
                                           dim3(kThreads), args, 0,
                                           static_cast<cudaStream_t>(stream)));
}

}  // namespace

int LaunchScale(void* dst, const void* src, int64_t n, DataType dtype, double factor,
                void* stream) {
  if (n <= 0) return cudaSuccess;
  const char* suffix = Suffix(dtype);
  if (!suffix) return cudaErrorInvalidValue;
  long long count = n;
  void* args[] = {&dst, const_cast<void**>(&src), &count, &factor};
  return Launch(std::string("scale_") + suffix, n, args, stream);
}

int LaunchCopyBatch(void* const* dst, const void* const* src, const int64_t* bytes, int n,
                    void* stream) {
  if (n <= 0) return cudaSuccess;
  if (n > kMaxCopyBatch) return cudaErrorInvalidValue;
  // The kernel's parameter, laid out as in kSource's CopyBatch.
  struct {
    void* dst[kMaxCopyBatch];
    const void* src[kMaxCopyBatch];
    long long bytes[kMaxCopyBatch];
  } batch;
  int64_t largest = 0;
  for (int i = 0; i < n; ++i) {
    batch.dst[i] = dst[i];
    batch.src[i] = src[i];
    batch.bytes[i] = bytes[i];
    largest = std::max(largest, bytes[i]);
  }
  cudaKernel_t k = nullptr;
  int err = KernelFor("copy_batch", &k);
  if (err != 0) return err;
  // One block per 64 KB of the largest copy, up to 64, for each copy.
  const unsigned per_copy = static_cast<unsigned>(std::min<int64_t>(64, std::max<int64_t>(1, (largest + 65535) / 65536)));
  void* args[] = {&batch};
  return static_cast<int>(cudaLaunchKernel(reinterpret_cast<const void*>(k),
                                           dim3(per_copy, static_cast<unsigned>(n)),
                                           dim3(kThreads), args, 0,
                                           static_cast<cudaStream_t>(stream)));
}

int LaunchDivide(void* buf, int64_t n, DataType dtype, int64_t divisor, void* stream) {
  if (n <= 0) return cudaSuccess;
  const char* suffix = Suffix(dtype);
  if (!suffix || divisor == 0) return cudaErrorInvalidValue;
  long long count = n, q = divisor;
  void* args[] = {&buf, &count, &q};
  return Launch(std::string("divide_") + suffix, n, args, stream);
}

}  // namespace cuda
}  // namespace tfring

#endif  // GPU build
