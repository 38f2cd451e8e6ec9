// TensorFlow kernels. Each one only translates between TF tensors and core
// requests: it checks what TF knows locally, builds a TensorTableEntry and
// enqueues it. Negotiation, validation across ranks and the data movement
// all happen in the core's background thread, which calls `done` at the end.
#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"

#include "../common/operations.h"
#include "convert.h"
#include "tf_device.h"

namespace tfring {
namespace {

namespace tf = ::tensorflow;

void* DataOf(const tf::Tensor* t) { return const_cast<char*>(t->tensor_data().data()); }

// The TfringNamed* ops (eager mode) carry the collective's key as their last
// input, a string scalar; the Horovod ops have no string input. Returns that
// input's index, or -1.
int NameInput(tf::OpKernelConstruction* c) {
  const int last = c->num_inputs() - 1;
  return last >= 0 && c->input_type(last) == tf::DT_STRING ? last : -1;
}

// Reads the key from the name input of a TfringNamed* op.
Status KeyFromInput(tf::OpKernelContext* ctx, int index, std::string* key) {
  const tf::Tensor& t = ctx->input(index);
  if (t.dims() != 0) {
    return Status::InvalidArgument("tfring: the tensor_name input must be a string scalar, not "
                                   "shape " + t.shape().DebugString());
  }
  *key = std::string(t.scalar<tf::tstring>()());
  if (key->empty()) return Status::InvalidArgument("tfring: the tensor_name input is empty");
  return Status::OK();
}

// Completes an op that submitted several entries once the last one is done,
// reporting the first error.
class GroupCompletion {
 public:
  GroupCompletion(tf::OpKernelContext* ctx, tf::AsyncOpKernel::DoneCallback done, int count)
      : ctx_(ctx), done_(std::move(done)), remaining_(count) {}
  // Marks `n` entries finished with `s`; the last one completes the op.
  void Finish(const Status& s, int n = 1) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!s.ok() && status_.ok()) status_ = s;
    }
    if (remaining_.fetch_sub(n) == n) {
      ctx_->SetStatus(ToTFStatus(status_));
      done_();
    }
  }

 private:
  tf::OpKernelContext* ctx_;
  tf::AsyncOpKernel::DoneCallback done_;
  std::atomic<int> remaining_;
  std::mutex mu_;
  Status status_;
};

class CollectiveKernel : public tf::AsyncOpKernel {
 public:
  explicit CollectiveKernel(tf::OpKernelConstruction* c) : tf::AsyncOpKernel(c) {
    if (c->HasAttr("ignore_name_scope")) {
      OP_REQUIRES_OK(c, c->GetAttr("ignore_name_scope", &ignore_name_scope_));
    }
    if (c->HasAttr("tensor_name")) {
      OP_REQUIRES_OK(c, c->GetAttr("tensor_name", &tensor_name_));
    }
    if (c->HasAttr("process_set_id")) {
      OP_REQUIRES_OK(c, c->GetAttr("process_set_id", &process_set_id_));
    }
    name_input_ = NameInput(c);
    // A graph op's key is fixed with its node: made once, not per call.
    if (name_input_ < 0) key_ = CollectiveKey(name(), tensor_name_, ignore_name_scope_);
  }

  void ComputeAsync(tf::OpKernelContext* ctx, DoneCallback done) override {
    OP_REQUIRES_OK_ASYNC(ctx, ToTFStatus(CheckInitialized()), done);
    std::string from_input;
    if (name_input_ >= 0) {
      OP_REQUIRES_OK_ASYNC(ctx, ToTFStatus(KeyFromInput(ctx, name_input_, &from_input)), done);
    }
    const std::string& key = name_input_ >= 0 ? from_input : key_;
    const int n = NumEntries(ctx);
    auto group = std::make_shared<GroupCompletion>(ctx, done, n);
    for (int i = 0; i < n; ++i) {
      TensorTableEntry e;
      e.name = EntryName(key, n, grouped_, i);
      if (grouped_) {
        e.group_name = key;
        e.group_size = n;
        e.group_index = i;
      }
      Status s = Prepare(ctx, i, &e);
      if (s.ok()) {
        e.callback = [group](const Status& st, int32_t) { group->Finish(st); };
        s = Enqueue(process_set_id_, std::move(e));
      }
      if (!s.ok()) {
        // Entries already enqueued will still finish; count the rest as failed.
        group->Finish(s, n - i);
        return;
      }
    }
  }

 protected:
  virtual int NumEntries(tf::OpKernelContext* ctx) const { return 1; }
  // The tensor inputs of a grouped op (all but the name input).
  int NumTensorInputs(tf::OpKernelContext* ctx) const {
    return ctx->num_inputs() - (name_input_ >= 0 ? 1 : 0);
  }
  // Fills everything but name, group fields and callback for entry `i`.
  virtual Status Prepare(tf::OpKernelContext* ctx, int i, TensorTableEntry* e) = 0;

  Status FillInput(tf::OpKernelContext* ctx, int i, TensorTableEntry* e) {
    const tf::Tensor& t = ctx->input(i);
    TFRING_RETURN_IF_ERROR(ToCoreType(t.dtype(), &e->dtype));
    e->shape = ToCoreShape(t.shape());
    e->input = t.tensor_data().data();
    return PlaceInput(ctx, i, e);
  }

  // Output with the input's shape, reusing the input buffer when TF allows.
  Status SameShapeOutput(tf::OpKernelContext* ctx, int i, TensorTableEntry* e) {
    tf::Tensor* out = nullptr;
    TFRING_RETURN_IF_ERROR(FromTFStatus(
        ctx->forward_input_or_allocate_output({i}, i, ctx->input(i).shape(), &out)));
    e->output = DataOf(out);
    return Status::OK();
  }

  static AllocateFn Allocator(tf::OpKernelContext* ctx, int i) {
    return [ctx, i](const TensorShape& shape, void** data) {
      tf::Tensor* out = nullptr;
      TFRING_RETURN_IF_ERROR(FromTFStatus(ctx->allocate_output(i, ToTFShape(shape), &out)));
      *data = DataOf(out);
      return Status::OK();
    };
  }

  bool grouped_ = false;
  bool ignore_name_scope_ = false;
  std::string tensor_name_;
  std::string key_;  // a graph op's key (CollectiveKey); empty with a name input
  int process_set_id_ = 0;
  int name_input_ = -1;
};

// Reads the reduce op and scale factors shared by allreduce and reducescatter.
struct ReductionAttrs {
  void Read(tf::OpKernelConstruction* c) {
    int op = 0;
    OP_REQUIRES_OK(c, c->GetAttr("reduce_op", &op));
    reduce_op = static_cast<ReduceOp>(op);
    OP_REQUIRES_OK(c, c->GetAttr("prescale_factor", &prescale));
    OP_REQUIRES_OK(c, c->GetAttr("postscale_factor", &postscale));
  }
  void Apply(TensorTableEntry* e) const {
    e->reduce_op = reduce_op;
    e->prescale_factor = prescale;
    e->postscale_factor = postscale;
  }
  ReduceOp reduce_op = ReduceOp::SUM;
  float prescale = 1.0f, postscale = 1.0f;
};

class AllreduceOp : public CollectiveKernel {
 public:
  explicit AllreduceOp(tf::OpKernelConstruction* c) : CollectiveKernel(c) {
    attrs_.Read(c);
    grouped_ = c->HasAttr("num_tensors");
  }

 protected:
  int NumEntries(tf::OpKernelContext* ctx) const override { return NumTensorInputs(ctx); }
  Status Prepare(tf::OpKernelContext* ctx, int i, TensorTableEntry* e) override {
    e->type = CollectiveType::ALLREDUCE;
    attrs_.Apply(e);
    TFRING_RETURN_IF_ERROR(FillInput(ctx, i, e));
    return SameShapeOutput(ctx, i, e);
  }

 private:
  ReductionAttrs attrs_;
};

class AllgatherOp : public CollectiveKernel {
 public:
  explicit AllgatherOp(tf::OpKernelConstruction* c) : CollectiveKernel(c) {
    grouped_ = c->HasAttr("num_tensors");
  }

 protected:
  int NumEntries(tf::OpKernelContext* ctx) const override { return NumTensorInputs(ctx); }
  Status Prepare(tf::OpKernelContext* ctx, int i, TensorTableEntry* e) override {
    e->type = CollectiveType::ALLGATHER;
    TFRING_RETURN_IF_ERROR(FillInput(ctx, i, e));
    e->allocate_output = Allocator(ctx, i);
    return Status::OK();
  }
};

class BroadcastOp : public CollectiveKernel {
 public:
  explicit BroadcastOp(tf::OpKernelConstruction* c) : CollectiveKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("root_rank", &root_rank_));
  }

 protected:
  Status Prepare(tf::OpKernelContext* ctx, int i, TensorTableEntry* e) override {
    e->type = CollectiveType::BROADCAST;
    e->root_rank = root_rank_;
    TFRING_RETURN_IF_ERROR(FillInput(ctx, i, e));
    if (Rank() == root_rank_) {
      // The root's result is its input, bit for bit, so it gets the input's
      // buffer (shared and reference-counted, as TF's Identity does) instead
      // of a fresh output to copy into: a caller that keeps its input alive
      // would otherwise pay a second pass over memory on the root, which
      // made the root, not the peers, the slowest rank of a large broadcast.
      // root_rank_ and Rank() are both job-wide ranks. No data plane writes
      // the root's buffer in a broadcast: the root only reads it.
      ctx->set_output(i, ctx->input(i));
      e->output = const_cast<void*>(e->input);
      return Status::OK();
    }
    return SameShapeOutput(ctx, i, e);
  }

 private:
  int root_rank_ = 0;
};

// Broadcasts straight into a resource variable's buffer. The variable's lock
// is held until the broadcast completes so no one reads a half-written value.
class BroadcastInplaceResourceOp : public tf::AsyncOpKernel {
 public:
  explicit BroadcastInplaceResourceOp(tf::OpKernelConstruction* c) : tf::AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("root_rank", &root_rank_));
    OP_REQUIRES_OK(c, c->GetAttr("process_set_id", &process_set_id_));
    OP_REQUIRES_OK(c, c->GetAttr("ignore_name_scope", &ignore_name_scope_));
    if (c->HasAttr("tensor_name")) OP_REQUIRES_OK(c, c->GetAttr("tensor_name", &tensor_name_));
    name_input_ = NameInput(c);
    if (name_input_ < 0) key_ = CollectiveKey(name(), tensor_name_, ignore_name_scope_);
  }

  void ComputeAsync(tf::OpKernelContext* ctx, DoneCallback done) override {
    OP_REQUIRES_OK_ASYNC(ctx, ToTFStatus(CheckInitialized()), done);
    std::string key;
    if (name_input_ >= 0) OP_REQUIRES_OK_ASYNC(ctx, ToTFStatus(KeyFromInput(ctx, name_input_, &key)), done);
    tf::core::RefCountPtr<tf::Var> ref;
    OP_REQUIRES_OK_ASYNC(ctx, tf::LookupResource(ctx, tf::HandleFromInput(ctx, 0), &ref), done);
    tf::Var* var = ref.release();
    var->mu()->lock();
    auto release = [var]() {
      var->mu()->unlock();
      var->Unref();
    };
    tf::Tensor* t = var->tensor();
    // Written in place, unless someone else still holds the buffer (a read
    // in flight): then into a fresh one on the variable's device, which
    // replaces the old one once the broadcast is done. The core copies the
    // root's value across itself, on the device where it lives.
    const bool shared = !t->RefCountIsOne();
    auto target = std::make_shared<tf::Tensor>(*t);
    if (shared) {
      tf::Status as = ctx->allocate_temp(t->dtype(), t->shape(), target.get());
      if (!as.ok()) {
        release();
        ctx->SetStatus(as);
        done();
        return;
      }
    }
    TensorTableEntry e;
    e.name = name_input_ >= 0 ? key : key_;
    e.type = CollectiveType::BROADCAST;
    e.root_rank = root_rank_;
    e.shape = ToCoreShape(t->shape());
    e.input = DataOf(t);
    e.output = DataOf(target.get());
    e.callback = [ctx, done, release, var, target](const Status& s, int32_t) {
      if (s.ok()) *var->tensor() = *target;
      release();
      ctx->SetStatus(ToTFStatus(s));
      done();
    };
    Status s = ToCoreType(t->dtype(), &e.dtype);
    if (s.ok()) s = PlaceVariable(ctx, t->dtype(), &e);
    if (s.ok()) s = Enqueue(process_set_id_, std::move(e));
    if (!s.ok()) {
      release();
      ctx->SetStatus(ToTFStatus(s));
      done();
    }
  }

 private:
  int root_rank_ = 0;
  int process_set_id_ = 0;
  bool ignore_name_scope_ = false;
  std::string tensor_name_;
  std::string key_;  // as CollectiveKernel's
  int name_input_ = -1;
};

class AlltoallOp : public CollectiveKernel {
 public:
  using CollectiveKernel::CollectiveKernel;

 protected:
  Status Prepare(tf::OpKernelContext* ctx, int i, TensorTableEntry* e) override {
    e->type = CollectiveType::ALLTOALL;
    TFRING_RETURN_IF_ERROR(FillInput(ctx, 0, e));
    if (e->shape.empty()) {
      return Status::InvalidArgument("tfring: alltoall needs a tensor with at least one dimension");
    }
    const tf::Tensor& splits = ctx->input(1);
    auto flat = splits.flat<int32_t>();
    for (int64_t j = 0; j < flat.size(); ++j) e->splits.push_back(flat(j));
    e->allocate_output = Allocator(ctx, 0);
    e->set_received_splits = [ctx](const std::vector<int64_t>& received) {
      tf::Tensor* out = nullptr;
      if (!ctx->allocate_output(1, tf::TensorShape({static_cast<int64_t>(received.size())}), &out)
               .ok())
        return;
      auto v = out->flat<int32_t>();
      for (size_t j = 0; j < received.size(); ++j) v(j) = static_cast<int32_t>(received[j]);
    };
    return Status::OK();
  }
};

class ReducescatterOp : public CollectiveKernel {
 public:
  explicit ReducescatterOp(tf::OpKernelConstruction* c) : CollectiveKernel(c) {
    attrs_.Read(c);
    grouped_ = c->HasAttr("num_tensors");
  }

 protected:
  int NumEntries(tf::OpKernelContext* ctx) const override { return NumTensorInputs(ctx); }
  Status Prepare(tf::OpKernelContext* ctx, int i, TensorTableEntry* e) override {
    e->type = CollectiveType::REDUCESCATTER;
    attrs_.Apply(e);
    TFRING_RETURN_IF_ERROR(FillInput(ctx, i, e));
    e->allocate_output = Allocator(ctx, i);
    return Status::OK();
  }

 private:
  ReductionAttrs attrs_;
};

class BarrierOp : public CollectiveKernel {
 public:
  using CollectiveKernel::CollectiveKernel;

 protected:
  Status Prepare(tf::OpKernelContext*, int, TensorTableEntry* e) override {
    e->type = CollectiveType::BARRIER;
    e->dtype = DataType::UINT8;
    return Status::OK();
  }
};

class JoinOp : public tf::AsyncOpKernel {
 public:
  explicit JoinOp(tf::OpKernelConstruction* c) : tf::AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("process_set_id", &process_set_id_));
  }
  void ComputeAsync(tf::OpKernelContext* ctx, DoneCallback done) override {
    OP_REQUIRES_OK_ASYNC(ctx, ToTFStatus(CheckInitialized()), done);
    TensorTableEntry e;
    e.name = kJoinTensorName;
    e.type = CollectiveType::JOIN;
    e.dtype = DataType::UINT8;
    e.callback = [ctx, done](const Status& s, int32_t last_joined) {
      if (s.ok()) {
        tf::Tensor* out = nullptr;
        tf::Status as = ctx->allocate_output(0, tf::TensorShape({}), &out);
        if (as.ok()) out->scalar<int32_t>()() = last_joined;
        ctx->SetStatus(as);
      } else {
        ctx->SetStatus(ToTFStatus(s));
      }
      done();
    };
    OP_REQUIRES_OK_ASYNC(ctx, ToTFStatus(Enqueue(process_set_id_, std::move(e))), done);
  }

 private:
  int process_set_id_ = 0;
};

// Graph-time topology queries (rank_op(), size_op(), ...).
template <int (*Query)(int process_set_id)>
class ScalarQueryOp : public tf::OpKernel {
 public:
  explicit ScalarQueryOp(tf::OpKernelConstruction* c) : tf::OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("process_set_id", &process_set_id_));
  }
  void Compute(tf::OpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, ToTFStatus(CheckInitialized()));
    tf::Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({}), &out));
    out->scalar<int32_t>()() = Query(process_set_id_);
  }

 private:
  int process_set_id_ = 0;
};


#define TFRING_CPU_KERNEL(NAME, CLASS) \
  REGISTER_KERNEL_BUILDER(Name(NAME).Device(::tensorflow::DEVICE_CPU), CLASS)

TFRING_CPU_KERNEL("HorovodAllreduce", AllreduceOp);
TFRING_CPU_KERNEL("HorovodGroupedAllreduce", AllreduceOp);
TFRING_CPU_KERNEL("HorovodAllgather", AllgatherOp);
TFRING_CPU_KERNEL("HorovodGroupedAllgather", AllgatherOp);
TFRING_CPU_KERNEL("HorovodBroadcast", BroadcastOp);
TFRING_CPU_KERNEL("HorovodBroadcastInplaceResource", BroadcastInplaceResourceOp);
TFRING_CPU_KERNEL("HorovodAlltoall", AlltoallOp);
TFRING_CPU_KERNEL("HorovodReducescatter", ReducescatterOp);
TFRING_CPU_KERNEL("HorovodGroupedReducescatter", ReducescatterOp);
TFRING_CPU_KERNEL("HorovodBarrier", BarrierOp);
TFRING_CPU_KERNEL("HorovodJoin", JoinOp);
TFRING_CPU_KERNEL("TfringNamedAllreduce", AllreduceOp);
TFRING_CPU_KERNEL("TfringNamedGroupedAllreduce", AllreduceOp);
TFRING_CPU_KERNEL("TfringNamedAllgather", AllgatherOp);
TFRING_CPU_KERNEL("TfringNamedGroupedAllgather", AllgatherOp);
TFRING_CPU_KERNEL("TfringNamedBroadcast", BroadcastOp);
TFRING_CPU_KERNEL("TfringNamedBroadcastInplaceResource", BroadcastInplaceResourceOp);
TFRING_CPU_KERNEL("TfringNamedAlltoall", AlltoallOp);
TFRING_CPU_KERNEL("TfringNamedReducescatter", ReducescatterOp);
TFRING_CPU_KERNEL("TfringNamedGroupedReducescatter", ReducescatterOp);
TFRING_CPU_KERNEL("TfringNamedBarrier", BarrierOp);
// A GPU build registers the collectives for GPU tensors too. Their keys
// (the TfringNamed* ops' tensor_name), alltoall's splits and the splits it
// received stay in host memory, as TensorFlow keeps strings and int32 there
// for GPU kernels anyway (as it does int32 tensors: tf_device.h hands those
// to the core as host tensors). Barriers, joins and queries have no tensor
// on a device: soft placement runs them on the CPU kernels above.
#ifdef TFRING_WITH_NCCL
#define TFRING_GPU_KERNEL(NAME, CLASS, ...) \
  REGISTER_KERNEL_BUILDER(Name(NAME).Device(::tensorflow::DEVICE_GPU) __VA_ARGS__, CLASS)

TFRING_GPU_KERNEL("HorovodAllreduce", AllreduceOp);
TFRING_GPU_KERNEL("HorovodGroupedAllreduce", AllreduceOp);
TFRING_GPU_KERNEL("HorovodAllgather", AllgatherOp);
TFRING_GPU_KERNEL("HorovodGroupedAllgather", AllgatherOp);
TFRING_GPU_KERNEL("HorovodBroadcast", BroadcastOp);
TFRING_GPU_KERNEL("HorovodBroadcastInplaceResource", BroadcastInplaceResourceOp,
                  .HostMemory("resource"));
TFRING_GPU_KERNEL("HorovodAlltoall", AlltoallOp, .HostMemory("splits").HostMemory("received_splits"));
TFRING_GPU_KERNEL("HorovodReducescatter", ReducescatterOp);
TFRING_GPU_KERNEL("HorovodGroupedReducescatter", ReducescatterOp);
TFRING_GPU_KERNEL("TfringNamedAllreduce", AllreduceOp, .HostMemory("tensor_name"));
TFRING_GPU_KERNEL("TfringNamedGroupedAllreduce", AllreduceOp, .HostMemory("tensor_name"));
TFRING_GPU_KERNEL("TfringNamedAllgather", AllgatherOp, .HostMemory("tensor_name"));
TFRING_GPU_KERNEL("TfringNamedGroupedAllgather", AllgatherOp, .HostMemory("tensor_name"));
TFRING_GPU_KERNEL("TfringNamedBroadcast", BroadcastOp, .HostMemory("tensor_name"));
TFRING_GPU_KERNEL("TfringNamedBroadcastInplaceResource", BroadcastInplaceResourceOp,
                  .HostMemory("resource").HostMemory("tensor_name"));
TFRING_GPU_KERNEL("TfringNamedAlltoall", AlltoallOp,
                  .HostMemory("splits").HostMemory("received_splits").HostMemory("tensor_name"));
TFRING_GPU_KERNEL("TfringNamedReducescatter", ReducescatterOp, .HostMemory("tensor_name"));
TFRING_GPU_KERNEL("TfringNamedGroupedReducescatter", ReducescatterOp,
                  .HostMemory("tensor_name"));
#endif  // TFRING_WITH_NCCL

TFRING_CPU_KERNEL("HorovodSize", ScalarQueryOp<SetSize>);
TFRING_CPU_KERNEL("HorovodRank", ScalarQueryOp<SetRank>);
TFRING_CPU_KERNEL("HorovodLocalSize", ScalarQueryOp<QueryLocalSize>);
TFRING_CPU_KERNEL("HorovodLocalRank", ScalarQueryOp<QueryLocalRank>);
TFRING_CPU_KERNEL("HorovodProcessSetIncluded", ScalarQueryOp<SetIncluded>);

}  // namespace
}  // namespace tfring
