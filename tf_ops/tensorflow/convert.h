// Translation between TensorFlow's types and the core's, shared by the TF
// kernels (kernels.cc) and the XLA lowering (xla/): one mapping of statuses,
// dtypes and shapes, so a collective fails the same way inside XLA and out.
#ifndef TFRING_TENSORFLOW_CONVERT_H
#define TFRING_TENSORFLOW_CONVERT_H

#include <string>

#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/platform/status.h"

#include "../common/common.h"
#include "../common/status.h"

namespace tfring {

// The TF status for a core status: the matching code, the core's message,
// and the payload that carries its cause and rank to Python
// (tfring/common/exceptions.py FAILURE_PAYLOAD).
::tensorflow::Status ToTFStatus(const Status& s);
Status FromTFStatus(const ::tensorflow::Status& s);
// InvalidArgument naming the dtype when the collectives do not support it.
Status ToCoreType(::tensorflow::DataType dt, DataType* out);
TensorShape ToCoreShape(const ::tensorflow::TensorShape& s);
::tensorflow::TensorShape ToTFShape(const TensorShape& s);

// The key a graph op submits its collective under: its `tensor_name`
// attribute when set, else its node name (without the name scope when
// `ignore_name_scope`). Node names are fixed when the graph is traced, so
// they agree across ranks that trace the same function.
std::string CollectiveKey(const std::string& node_name, const std::string& tensor_name,
                          bool ignore_name_scope);
// The name of entry `i` of an op that submits `n` entries under `key`.
std::string EntryName(const std::string& key, int n, bool grouped, int i);

// Topology queries of the graph ops (size_op(), rank_op(), ...), by process
// set id; the TF kernels answer them per call, the XLA lowering once, as
// constants of the compiled step. -1 (0 for SetIncluded) when unknown.
int SetSize(int process_set_id);
int SetRank(int process_set_id);
int SetIncluded(int process_set_id);
int QueryLocalSize(int process_set_id);
int QueryLocalRank(int process_set_id);

}  // namespace tfring

#endif  // TFRING_TENSORFLOW_CONVERT_H
