// The handler of the tfring_collective custom call (xla_kernels.cc), run by
// XLA each time a compiled step reaches a collective. It does what the TF
// kernels do: one TensorTableEntry per tensor, into the core's Enqueue, and
// it blocks XLA's thread until the core has finished them, because XLA's
// buffers are only valid during the call. A failure returns the core's
// status as the TF kernels do (same code, message and the cause/rank
// payload), so a compiled step raises what an uncompiled one raises.
//
// Registered with XLA's typed FFI for the host platform and, in the GPU
// build, for CUDA, where the call gets XLA's stream and records the ready
// event there, so the core starts only once XLA's kernels producing the
// inputs have run.
#include "xla_support.h"

#if TFRING_XLA_KERNELS

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/c_api_internal.h"
#include "xla/ffi/api/ffi.h"

#include "../../common/gpu_support.h"
#include "../../common/operations.h"
#include "../convert.h"
#include "collective_config.h"

namespace xla::ffi {
// TensorFlow's XLA FFI API table (exported by libtensorflow_cc). Declared
// here rather than through xla/ffi/ffi_api.h, which pulls in XLA's internals.
const XLA_FFI_Api* GetXlaFfiApi();
}  // namespace xla::ffi

namespace tfring {
namespace {

namespace ffi = ::xla::ffi;

// Counts the entries of one call down; the call returns at zero.
class Waiter {
 public:
  explicit Waiter(int count) : remaining_(count) {}
  void Finish(const Status& s, int n = 1) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!s.ok() && status_.ok()) status_ = s;
    remaining_ -= n;
    if (remaining_ <= 0) cv_.notify_all();
  }
  Status Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return remaining_ <= 0; });
    return status_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int remaining_;
  Status status_;
};

// The core status of the last call that failed on this thread, for Forward:
// the typed FFI handler can only return a code and a message.
thread_local Status last_failure;

ffi::Error Fail(const Status& s) {
  last_failure = s;
  return ffi::Error(ffi::ErrorCode::kUnknown, s.message());
}

// Where the tensors live: the host, or a GPU whose stream XLA runs on.
struct Placement {
  int32_t device = kCpuDevice;
  void* stream = nullptr;
};

ffi::Error Run(const Placement& where, ffi::RemainingArgs args, ffi::RemainingRets rets,
               std::string_view encoded) {
  XlaCollectiveConfig config;
  Status s = XlaCollectiveConfig::Decode(std::string(encoded), &config);
  if (s.ok()) s = CheckInitialized();
  if (!s.ok()) return Fail(s);
  const int n = static_cast<int>(config.dtypes.size());
  if (static_cast<int>(args.size()) < n || static_cast<int>(rets.size()) < n) {
    return Fail(Status::Unknown("tfring: the XLA custom call for '" + config.name +
                                "' got fewer buffers than its configuration names"));
  }
  auto waiter = std::make_shared<Waiter>(n);
  for (int i = 0; i < n; ++i) {
    auto in = args.get<ffi::AnyBuffer>(i);
    auto out = rets.get<ffi::AnyBuffer>(i);
    if (in.has_error() || out.has_error()) {
      waiter->Finish(Status::Unknown("tfring: the XLA custom call for '" + config.name +
                                     "' got a buffer of an unexpected kind"), n - i);
      break;
    }
    void* out_data = (*out)->untyped_data();
    const int64_t out_elements = static_cast<int64_t>((*out)->element_count());
    TensorTableEntry e;
    e.name = EntryName(config.name, n, config.grouped, i);
    if (config.grouped) {
      e.group_name = config.name;
      e.group_size = n;
      e.group_index = i;
    }
    e.type = config.type;
    e.dtype = config.dtypes[i];
    e.shape = config.shapes[i];
    e.reduce_op = config.reduce_op;
    e.prescale_factor = config.prescale_factor;
    e.postscale_factor = config.postscale_factor;
    e.root_rank = config.root_rank;
    e.input = in->untyped_data();
    e.device = where.device;
    if (config.type == CollectiveType::ALLREDUCE || config.type == CollectiveType::BROADCAST) {
      e.output = out_data;
    } else {
      // XLA sized the output at compile time (xla_kernels.cc); negotiation
      // has checked the ranks agree with that (Request::same_rows).
      e.same_rows = config.type != CollectiveType::REDUCESCATTER;
      const std::string name = e.name;
      e.allocate_output = [out_data, out_elements, name](const TensorShape& shape, void** data) {
        if (NumElements(shape) != out_elements) {
          return Status::Unknown("tfring: '" + name + "' negotiated an output of shape " +
                                 ShapeString(shape) + ", which does not fit the " +
                                 std::to_string(out_elements) +
                                 " elements XLA compiled for");
        }
        *data = out_data;
        return Status::OK();
      };
    }
    if (IsGpuDevice(where.device)) s = RecordReadyEvent(where.device, where.stream, &e.ready_event);
    if (s.ok()) {
      e.callback = [waiter](const Status& st, int32_t) { waiter->Finish(st); };
      s = Enqueue(config.process_set_id, std::move(e));
    }
    if (!s.ok()) {
      waiter->Finish(s, n - i);  // entries already enqueued still finish
      break;
    }
  }
  s = waiter->Wait();
  return s.ok() ? ffi::Error::Success() : Fail(s);
}

ffi::Error HostCollective(ffi::RemainingArgs args, ffi::RemainingRets rets,
                          std::string_view config) {
  return Run(Placement{}, args, rets, config);
}

XLA_FFI_DEFINE_HANDLER(kHostHandler, HostCollective,
                       ffi::Ffi::Bind().RemainingArgs().RemainingRets().Attr<std::string_view>(
                           "config"));

// Runs `handler` and, when it failed in a collective, returns the core's
// status itself through XLA's internal API (code, message and the payload
// with the cause and rank, as the TF kernels set them), so the Python error
// is the one an uncompiled step raises. Without that API the handler's own
// error (the core's message, code UNKNOWN) stands.
XLA_FFI_Error* Forward(XLA_FFI_Handler* handler, XLA_FFI_CallFrame* frame) {
  last_failure = Status::OK();
  XLA_FFI_Error* error = handler(frame);
  if (error == nullptr || last_failure.ok()) return error;
  const XLA_FFI_Api* api = frame->api;
  if (api == nullptr || api->internal_api == nullptr ||
      api->internal_api->XLA_FFI_INTERNAL_Error_Forward == nullptr) {
    return error;
  }
  XLA_FFI_Error_Destroy_Args destroy{XLA_FFI_Error_Destroy_Args_STRUCT_SIZE, nullptr, error};
  api->XLA_FFI_Error_Destroy(&destroy);
  ::tensorflow::Status status = ToTFStatus(last_failure);
  last_failure = Status::OK();
  return api->internal_api->XLA_FFI_INTERNAL_Error_Forward(&status);
}

XLA_FFI_Error* HostEntry(XLA_FFI_CallFrame* frame) { return Forward(kHostHandler, frame); }

XLA_FFI_REGISTER_HANDLER(::xla::ffi::GetXlaFfiApi(), kXlaCollectiveTarget, "Host", HostEntry);

#ifdef TFRING_WITH_NCCL
ffi::Error CudaCollective(void* stream, int32_t device, ffi::RemainingArgs args,
                          ffi::RemainingRets rets, std::string_view config) {
  return Run(Placement{device, stream}, args, rets, config);
}

XLA_FFI_DEFINE_HANDLER(kCudaHandler, CudaCollective,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::PlatformStream<void*>>()
                           .Ctx<ffi::DeviceOrdinal>()
                           .RemainingArgs()
                           .RemainingRets()
                           .Attr<std::string_view>("config"));

XLA_FFI_Error* CudaEntry(XLA_FFI_CallFrame* frame) { return Forward(kCudaHandler, frame); }

XLA_FFI_REGISTER_HANDLER(::xla::ffi::GetXlaFfiApi(), kXlaCollectiveTarget, "CUDA", CudaEntry);
#endif  // TFRING_WITH_NCCL

}  // namespace
}  // namespace tfring

#endif  // TFRING_XLA_KERNELS
