// Op definitions. The names and attributes are Horovod's, so graphs built
// with Horovod load and run here; attributes that Horovod lacks have
// defaults, which keeps those graphs valid.
//
// `tensor_name` is ours: eager execution ignores an op's name, so without it
// every eager allreduce would be keyed "HorovodAllreduce" and two threads'
// collectives could pair up wrongly across ranks. When set, it is the key.
//
// Eager mode uses the TfringNamed* twins instead, which take that key as a
// string scalar input: TF's eager runtime builds and keeps one kernel per
// distinct set of attribute values, so a key passed as an attribute costs a
// kernel (~35 KB, never freed) per distinct name. The Horovod ops stay for
// graphs (tf.function, TF1), where the node name is the key.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tfring {
namespace {

using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

#define TFRING_DTYPES "{uint8, int8, uint16, int16, int32, int64, float16, bfloat16, float32, float64, bool}"

::tensorflow::Status FirstDimUnknown(InferenceContext* c, int input, int output) {
  ShapeHandle out;
  TF_RETURN_IF_ERROR(c->ReplaceDim(c->input(input), 0, c->UnknownDim(), &out));
  c->set_output(output, out);
  return ::tensorflow::OkStatus();
}

// Alltoall's rows and received splits depend on what the other ranks send.
::tensorflow::Status AlltoallShape(InferenceContext* c) {
  TF_RETURN_IF_ERROR(FirstDimUnknown(c, 0, 0));
  c->set_output(1, c->Vector(c->UnknownDim()));
  return ::tensorflow::OkStatus();
}

}  // namespace

REGISTER_OP("HorovodAllreduce")
    .Attr("T: " TFRING_DTYPES)
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("ignore_name_scope: bool = False")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Output("sum: T")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::UnchangedShape)
    .Doc("Reduces a tensor across all ranks of a process set.");

REGISTER_OP("HorovodGroupedAllreduce")
    .Attr("T: " TFRING_DTYPES)
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("ignore_name_scope: bool = False")
    .Attr("tensor_name: string = ''")
    .Attr("num_tensors: int")
    .Attr("process_set_id: int = 0")
    .Input("tensors: num_tensors*T")
    .Output("sum: num_tensors*T")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      for (int i = 0; i < c->num_inputs(); ++i) c->set_output(i, c->input(i));
      return ::tensorflow::OkStatus();
    })
    .Doc("Reduces a list of tensors across ranks as one fused request.");

REGISTER_OP("HorovodAllgather")
    .Attr("T: " TFRING_DTYPES)
    .Attr("ignore_name_scope: bool = False")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Output("output: T")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return FirstDimUnknown(c, 0, 0); })
    .Doc("Concatenates a tensor from every rank along its first dimension.");

REGISTER_OP("HorovodGroupedAllgather")
    .Attr("T: " TFRING_DTYPES)
    .Attr("ignore_name_scope: bool = False")
    .Attr("tensor_name: string = ''")
    .Attr("num_tensors: int")
    .Attr("process_set_id: int = 0")
    .Input("tensors: num_tensors*T")
    .Output("output: num_tensors*T")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      for (int i = 0; i < c->num_inputs(); ++i) TF_RETURN_IF_ERROR(FirstDimUnknown(c, i, i));
      return ::tensorflow::OkStatus();
    })
    .Doc("Allgathers a list of tensors as one request.");

REGISTER_OP("HorovodBroadcast")
    .Attr("T: " TFRING_DTYPES)
    .Attr("root_rank: int")
    .Attr("ignore_name_scope: bool = False")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Output("output: T")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::UnchangedShape)
    .Doc("Sends the root rank's tensor to every rank.");

REGISTER_OP("HorovodBroadcastInplaceResource")
    .Attr("T: " TFRING_DTYPES)
    .Attr("root_rank: int")
    .Attr("ignore_name_scope: bool = False")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("resource: resource")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc("Overwrites a resource variable with the root rank's value, in place.");

REGISTER_OP("HorovodAlltoall")
    .Attr("T: " TFRING_DTYPES)
    .Attr("ignore_name_scope: bool = False")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Input("splits: int32")
    .Output("output: T")
    .Output("received_splits: int32")
    .SetIsStateful()
    .SetShapeFn(AlltoallShape)
    .Doc("Sends splits[i] rows to rank i and concatenates what every rank sent here.");

REGISTER_OP("HorovodReducescatter")
    .Attr("T: " TFRING_DTYPES)
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("ignore_name_scope: bool = False")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Output("output: T")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return FirstDimUnknown(c, 0, 0); })
    .Doc("Reduces across ranks and leaves each rank its block of rows.");

REGISTER_OP("HorovodGroupedReducescatter")
    .Attr("T: " TFRING_DTYPES)
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("ignore_name_scope: bool = False")
    .Attr("tensor_name: string = ''")
    .Attr("num_tensors: int")
    .Attr("process_set_id: int = 0")
    .Input("tensors: num_tensors*T")
    .Output("output: num_tensors*T")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      for (int i = 0; i < c->num_inputs(); ++i) TF_RETURN_IF_ERROR(FirstDimUnknown(c, i, i));
      return ::tensorflow::OkStatus();
    })
    .Doc("Reducescatters a list of tensors as one request.");

REGISTER_OP("HorovodJoin")
    .Attr("process_set_id: int = 0")
    .Output("output: int32")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc("Waits until every rank has joined; returns the last rank that joined.");

REGISTER_OP("HorovodBarrier")
    .Attr("ignore_name_scope: bool = False")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc("Waits until every rank of the process set reaches the barrier.");

// --- The eager twins: the same attributes minus `tensor_name`, which is the
// last input instead. Shapes as their Horovod counterparts.

#define TFRING_REDUCTION_ATTRS                     \
  .Attr("reduce_op: int")                          \
  .Attr("prescale_factor: float = 1.0")            \
  .Attr("postscale_factor: float = 1.0")

#define TFRING_NAMED_ATTRS                         \
  .Attr("ignore_name_scope: bool = False")         \
  .Attr("process_set_id: int = 0")

namespace {
// Output i takes input i's shape (grouped allreduce); the name input has none.
::tensorflow::Status SameShapes(InferenceContext* c) {
  for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, c->input(i));
  return ::tensorflow::OkStatus();
}
::tensorflow::Status FirstDimsUnknown(InferenceContext* c) {
  for (int i = 0; i < c->num_outputs(); ++i) TF_RETURN_IF_ERROR(FirstDimUnknown(c, i, i));
  return ::tensorflow::OkStatus();
}
}  // namespace

REGISTER_OP("TfringNamedAllreduce")
    .Attr("T: " TFRING_DTYPES) TFRING_REDUCTION_ATTRS TFRING_NAMED_ATTRS
    .Input("tensor: T")
    .Input("tensor_name: string")
    .Output("sum: T")
    .SetIsStateful()
    .SetShapeFn(SameShapes)
    .Doc("HorovodAllreduce keyed by the `tensor_name` input (eager mode).");

REGISTER_OP("TfringNamedGroupedAllreduce")
    .Attr("T: " TFRING_DTYPES) TFRING_REDUCTION_ATTRS TFRING_NAMED_ATTRS
    .Attr("num_tensors: int")
    .Input("tensors: num_tensors*T")
    .Input("tensor_name: string")
    .Output("sum: num_tensors*T")
    .SetIsStateful()
    .SetShapeFn(SameShapes)
    .Doc("HorovodGroupedAllreduce keyed by the `tensor_name` input (eager mode).");

REGISTER_OP("TfringNamedAllgather")
    .Attr("T: " TFRING_DTYPES) TFRING_NAMED_ATTRS
    .Input("tensor: T")
    .Input("tensor_name: string")
    .Output("output: T")
    .SetIsStateful()
    .SetShapeFn(FirstDimsUnknown)
    .Doc("HorovodAllgather keyed by the `tensor_name` input (eager mode).");

REGISTER_OP("TfringNamedGroupedAllgather")
    .Attr("T: " TFRING_DTYPES) TFRING_NAMED_ATTRS
    .Attr("num_tensors: int")
    .Input("tensors: num_tensors*T")
    .Input("tensor_name: string")
    .Output("output: num_tensors*T")
    .SetIsStateful()
    .SetShapeFn(FirstDimsUnknown)
    .Doc("HorovodGroupedAllgather keyed by the `tensor_name` input (eager mode).");

REGISTER_OP("TfringNamedBroadcast")
    .Attr("T: " TFRING_DTYPES)
    .Attr("root_rank: int") TFRING_NAMED_ATTRS
    .Input("tensor: T")
    .Input("tensor_name: string")
    .Output("output: T")
    .SetIsStateful()
    .SetShapeFn(SameShapes)
    .Doc("HorovodBroadcast keyed by the `tensor_name` input (eager mode).");

REGISTER_OP("TfringNamedBroadcastInplaceResource")
    .Attr("T: " TFRING_DTYPES)
    .Attr("root_rank: int") TFRING_NAMED_ATTRS
    .Input("resource: resource")
    .Input("tensor_name: string")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc("HorovodBroadcastInplaceResource keyed by the `tensor_name` input (eager mode).");

REGISTER_OP("TfringNamedAlltoall")
    .Attr("T: " TFRING_DTYPES) TFRING_NAMED_ATTRS
    .Input("tensor: T")
    .Input("splits: int32")
    .Input("tensor_name: string")
    .Output("output: T")
    .Output("received_splits: int32")
    .SetIsStateful()
    .SetShapeFn(AlltoallShape)
    .Doc("HorovodAlltoall keyed by the `tensor_name` input (eager mode).");

REGISTER_OP("TfringNamedReducescatter")
    .Attr("T: " TFRING_DTYPES) TFRING_REDUCTION_ATTRS TFRING_NAMED_ATTRS
    .Input("tensor: T")
    .Input("tensor_name: string")
    .Output("output: T")
    .SetIsStateful()
    .SetShapeFn(FirstDimsUnknown)
    .Doc("HorovodReducescatter keyed by the `tensor_name` input (eager mode).");

REGISTER_OP("TfringNamedGroupedReducescatter")
    .Attr("T: " TFRING_DTYPES) TFRING_REDUCTION_ATTRS TFRING_NAMED_ATTRS
    .Attr("num_tensors: int")
    .Input("tensors: num_tensors*T")
    .Input("tensor_name: string")
    .Output("output: num_tensors*T")
    .SetIsStateful()
    .SetShapeFn(FirstDimsUnknown)
    .Doc("HorovodGroupedReducescatter keyed by the `tensor_name` input (eager mode).");

REGISTER_OP("TfringNamedBarrier")
    TFRING_NAMED_ATTRS
    .Input("tensor_name: string")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc("HorovodBarrier keyed by the `tensor_name` input (eager mode).");

#define TFRING_SCALAR_OP(NAME, DOC)                                    \
  REGISTER_OP(NAME)                                                    \
      .Attr("process_set_id: int = 0")                                 \
      .Output("output: int32")                                         \
      .SetIsStateful()                                                 \
      .SetShapeFn(::tensorflow::shape_inference::ScalarShape)          \
      .Doc(DOC)

TFRING_SCALAR_OP("HorovodSize", "Number of ranks in the process set.");
TFRING_SCALAR_OP("HorovodRank", "This process's rank in the process set.");
TFRING_SCALAR_OP("HorovodLocalSize", "Number of ranks on this host.");
TFRING_SCALAR_OP("HorovodLocalRank", "This process's rank among the ranks on this host.");
TFRING_SCALAR_OP("HorovodProcessSetIncluded", "1 if this process is in the process set, else 0.");

}  // namespace tfring
