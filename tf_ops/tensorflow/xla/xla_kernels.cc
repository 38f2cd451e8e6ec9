// The XLA lowering of tfring's graph ops (the Horovod* ops that tf.function
// builds). Each op becomes one custom call, tfring_collective, whose only
// attribute is an XlaCollectiveConfig; when the compiled step runs, the
// handler in custom_call.cc hands the tensors to the core's Enqueue, as the
// TF kernels do, and waits for it.
//
// XLA needs every output's shape now, before any rank has negotiated:
// - allreduce and broadcast: the input's shape;
// - allgather: size x the first dimension. Every rank must send as many rows
//   as this one; the request says so (Request::same_rows), and negotiation
//   fails the step on every rank when they do not;
// - alltoall: even splits only (no splits, or splits all equal), so each
//   rank receives its input's row count, with the same same_rows check;
//   other splits are an error now, naming the op;
// - reducescatter: this rank's block of rows (ScatterRows, the core's rule).
// The eager-only TfringNamed* ops, the in-place resource broadcast, barrier
// and join have no XLA kernel: a step that uses them cannot be compiled.
#include "xla_support.h"

#if TFRING_XLA_KERNELS

#include <string>
#include <vector>

#include "tensorflow/compiler/tf2xla/xla_op_kernel.h"
#include "tensorflow/compiler/tf2xla/shape_util.h"
#include "tensorflow/compiler/tf2xla/xla_op_registry.h"
#include "tensorflow/core/framework/types.h"
#include TFRING_XLA_BUILDER_HEADER

#include "../../common/operations.h"
#include "../convert.h"
#include "collective_config.h"

namespace tfring {
namespace {

namespace tf = ::tensorflow;

class XlaCollectiveOp : public tf::XlaOpKernel {
 public:
  XlaCollectiveOp(tf::OpKernelConstruction* c, CollectiveType type)
      : tf::XlaOpKernel(c), type_(type) {
    bool ignore_name_scope = false;
    std::string tensor_name;
    if (c->HasAttr("ignore_name_scope"))
      OP_REQUIRES_OK(c, c->GetAttr("ignore_name_scope", &ignore_name_scope));
    if (c->HasAttr("tensor_name")) OP_REQUIRES_OK(c, c->GetAttr("tensor_name", &tensor_name));
    config_.type = type;
    config_.name = CollectiveKey(name(), tensor_name, ignore_name_scope);
    if (c->HasAttr("process_set_id"))
      OP_REQUIRES_OK(c, c->GetAttr("process_set_id", &config_.process_set_id));
    if (c->HasAttr("reduce_op")) {
      int op = 0;
      float pre = 1.0f, post = 1.0f;
      OP_REQUIRES_OK(c, c->GetAttr("reduce_op", &op));
      OP_REQUIRES_OK(c, c->GetAttr("prescale_factor", &pre));
      OP_REQUIRES_OK(c, c->GetAttr("postscale_factor", &post));
      config_.reduce_op = static_cast<ReduceOp>(op);
      config_.prescale_factor = pre;
      config_.postscale_factor = post;
    }
    if (c->HasAttr("root_rank")) OP_REQUIRES_OK(c, c->GetAttr("root_rank", &config_.root_rank));
    config_.grouped = c->HasAttr("num_tensors");
  }

  void Compile(tf::XlaOpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, ToTFStatus(CheckInitialized()));
    // The set's size and this rank's place in it fix the output shapes. On a
    // rank outside the set the step still compiles; running it fails in
    // Enqueue with the error the TF kernel gives.
    int set_rank = -1;
    std::vector<int> ranks;
    const bool member = GetProcessSet(config_.process_set_id, &set_rank, &ranks).ok() &&
                        set_rank >= 0;
    const int size = member ? static_cast<int>(ranks.size()) : 1;
    if (!member) set_rank = 0;

    // Alltoall's second input is its splits; everything else is a tensor.
    const int tensors = type_ == CollectiveType::ALLTOALL ? 1 : ctx->num_inputs();
    XlaCollectiveConfig config = config_;
    std::vector<xla::XlaOp> operands;
    std::vector<xla::Shape> results;
    for (int i = 0; i < tensors; ++i) {
      DataType dtype;
      OP_REQUIRES_OK(ctx, ToTFStatus(ToCoreType(ctx->input_type(i), &dtype)));
      const tf::TensorShape in = ctx->InputShape(i);
      tf::TensorShape out = in;
      if (type_ == CollectiveType::ALLGATHER || type_ == CollectiveType::REDUCESCATTER ||
          type_ == CollectiveType::ALLTOALL) {
        OP_REQUIRES(ctx, in.dims() > 0,
                    ToTFStatus(Status::InvalidArgument(
                        std::string("tfring: ") + CollectiveName(type_) + " of tensor '" +
                        config.name + "' needs at least one dimension, but got a scalar.")));
        if (type_ == CollectiveType::ALLGATHER) out.set_dim(0, in.dim_size(0) * size);
        if (type_ == CollectiveType::REDUCESCATTER)
          out.set_dim(0, ScatterRows(in.dim_size(0), size, set_rank));
      }
      xla::Shape shape;
      OP_REQUIRES_OK(ctx, tf::TensorShapeToXLAShape(ctx->input_type(i), out, &shape));
      config.dtypes.push_back(dtype);
      config.shapes.push_back(ToCoreShape(in));
      operands.push_back(ctx->Input(i));
      results.push_back(shape);
    }
    if (type_ == CollectiveType::ALLTOALL) OP_REQUIRES_OK(ctx, CheckEvenSplits(ctx, size));

    xla::XlaBuilder* b = ctx->builder();
    const std::string attributes = "{config = \"" + config.Encode() + "\"}";
    xla::XlaOp call = xla::CustomCall(b, kXlaCollectiveTarget, operands,
                                      xla::ShapeUtil::MakeTupleShape(results), attributes,
                                      /*has_side_effect=*/true, /*output_operand_aliasing=*/{},
                                      /*literal=*/nullptr, xla::CustomCallSchedule::SCHEDULE_NONE,
                                      xla::CustomCallApiVersion::API_VERSION_TYPED_FFI);
    for (int i = 0; i < tensors; ++i) ctx->SetOutput(i, xla::GetTupleElement(call, i));
    if (type_ == CollectiveType::ALLTOALL) {
      // Even splits, the same row count everywhere: each rank sent dim0/size.
      const int64_t rows = ctx->InputShape(0).dim_size(0);
      std::vector<int32_t> received(size, static_cast<int32_t>(rows / size));
      ctx->SetOutput(1, xla::ConstantR1<int32_t>(b, received));
    }
  }

 private:
  // Alltoall's output shape is static only when every rank sends each rank
  // the same number of rows: no splits, or splits that are all equal and
  // known now.
  tf::Status CheckEvenSplits(tf::XlaOpKernelContext* ctx, int size) {
    std::vector<int64_t> splits;
    const std::string why = "tfring: HorovodAlltoall '" + config_.name +
                            "' cannot run inside XLA: ";
    if (!ctx->ConstantInputAsIntVector(1, &splits).ok()) {
      return ToTFStatus(Status::InvalidArgument(
          why + "its splits are not known at compile time, and XLA needs the output's shape "
                "then. Call alltoall without splits (even split), or outside the "
                "jit-compiled function."));
    }
    if (splits.empty()) return tf::OkStatus();
    const int64_t rows = ctx->InputShape(0).dim_size(0);
    bool even = static_cast<int>(splits.size()) == size;
    for (int64_t s : splits) even = even && s * size == rows;
    if (even) return tf::OkStatus();
    std::string list;
    for (int64_t s : splits) list += (list.empty() ? "" : ", ") + std::to_string(s);
    return ToTFStatus(Status::InvalidArgument(
        why + "splits [" + list + "] are uneven, so the received shape would depend on the "
              "other ranks' splits, and XLA needs static shapes. Inside XLA alltoall sends " +
        std::to_string(rows) + " / " + std::to_string(size) +
        " rows to every rank (no splits, or all equal); call it outside the jit-compiled "
        "function for uneven splits."));
  }

  CollectiveType type_;
  XlaCollectiveConfig config_;
};

template <CollectiveType kType>
class XlaCollective : public XlaCollectiveOp {
 public:
  explicit XlaCollective(tf::OpKernelConstruction* c) : XlaCollectiveOp(c, kType) {}
};

// Topology queries are constants of the compiled step.
template <int (*Query)(int process_set_id)>
class XlaTopologyOp : public tf::XlaOpKernel {
 public:
  explicit XlaTopologyOp(tf::OpKernelConstruction* c) : tf::XlaOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("process_set_id", &process_set_id_));
  }
  void Compile(tf::XlaOpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, ToTFStatus(CheckInitialized()));
    ctx->SetOutput(0, xla::ConstantR0<int32_t>(ctx->builder(), Query(process_set_id_)));
  }

 private:
  int process_set_id_ = 0;
};

// The ops that have no place in a compiled step fail its compilation with
// the reason, rather than TensorFlow's generic "unsupported operation":
// a barrier and a join have no data for XLA to order them by, and the
// in-place broadcast writes a resource variable, which XLA's custom call
// cannot.
class XlaRefused : public tf::XlaOpKernel {
 public:
  explicit XlaRefused(tf::OpKernelConstruction* c) : tf::XlaOpKernel(c) {}
  void Compile(tf::XlaOpKernelContext* ctx) override {
    const std::string& op = type_string();
    const std::string what = op == "HorovodBarrier"  ? "barrier()"
                             : op == "HorovodJoin"   ? "join()"
                                                     : "broadcast_() of a variable";
    ctx->SetStatus(::tensorflow::errors::InvalidArgument(
        "tfring: ", op, " '", name(), "' (", what,
        ") cannot run inside an XLA-compiled step (jit_compile=True): call it outside the "
        "compiled function, or compile that function with jit_compile=False. Every other "
        "collective works inside XLA."));
  }
};

using XlaAllreduce = XlaCollective<CollectiveType::ALLREDUCE>;
using XlaAllgather = XlaCollective<CollectiveType::ALLGATHER>;
using XlaBroadcast = XlaCollective<CollectiveType::BROADCAST>;
using XlaAlltoall = XlaCollective<CollectiveType::ALLTOALL>;
using XlaReducescatter = XlaCollective<CollectiveType::REDUCESCATTER>;

REGISTER_XLA_OP(Name("HorovodAllreduce"), XlaAllreduce);
REGISTER_XLA_OP(Name("HorovodGroupedAllreduce"), XlaAllreduce);
REGISTER_XLA_OP(Name("HorovodAllgather"), XlaAllgather);
REGISTER_XLA_OP(Name("HorovodGroupedAllgather"), XlaAllgather);
REGISTER_XLA_OP(Name("HorovodBroadcast"), XlaBroadcast);
REGISTER_XLA_OP(Name("HorovodAlltoall").CompileTimeConstantInput("splits"), XlaAlltoall);
REGISTER_XLA_OP(Name("HorovodReducescatter"), XlaReducescatter);
REGISTER_XLA_OP(Name("HorovodGroupedReducescatter"), XlaReducescatter);
REGISTER_XLA_OP(Name("HorovodSize"), XlaTopologyOp<SetSize>);
REGISTER_XLA_OP(Name("HorovodRank"), XlaTopologyOp<SetRank>);
REGISTER_XLA_OP(Name("HorovodLocalSize"), XlaTopologyOp<QueryLocalSize>);
REGISTER_XLA_OP(Name("HorovodLocalRank"), XlaTopologyOp<QueryLocalRank>);
REGISTER_XLA_OP(Name("HorovodProcessSetIncluded"), XlaTopologyOp<SetIncluded>);
REGISTER_XLA_OP(Name("HorovodBarrier"), XlaRefused);
REGISTER_XLA_OP(Name("HorovodJoin"), XlaRefused);
REGISTER_XLA_OP(Name("HorovodBroadcastInplaceResource"), XlaRefused);

}  // namespace
}  // namespace tfring

#endif  // TFRING_XLA_KERNELS
