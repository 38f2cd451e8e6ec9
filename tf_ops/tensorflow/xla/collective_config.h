// What an XLA custom call of tfring needs to know about its collective, fixed
// when TensorFlow lowers the op (xla_kernels.cc) and read back each time the
// compiled step runs it (custom_call.cc): the custom call's only attribute.
// Free of TensorFlow and XLA, so both sides share one encoding.
#ifndef TFRING_TENSORFLOW_XLA_COLLECTIVE_CONFIG_H
#define TFRING_TENSORFLOW_XLA_COLLECTIVE_CONFIG_H

#include <cstdint>
#include <string>
#include <vector>

#include "../../common/common.h"
#include "../../common/status.h"

namespace tfring {

struct XlaCollectiveConfig {
  CollectiveType type = CollectiveType::ALLREDUCE;
  // The key every rank submits under, fixed at trace time (the node name or
  // the op's tensor_name), as the TF kernel would use it.
  std::string name;
  int32_t process_set_id = 0;
  ReduceOp reduce_op = ReduceOp::SUM;
  double prescale_factor = 1.0;
  double postscale_factor = 1.0;
  int32_t root_rank = 0;
  bool grouped = false;
  // One per tensor: operand i and result i.
  std::vector<DataType> dtypes;
  std::vector<TensorShape> shapes;

  // A string of [0-9a-f] only: it travels inside the custom call's MLIR
  // attribute dictionary, where a node name's quotes or backslashes would
  // need escaping.
  std::string Encode() const;
  static Status Decode(const std::string& encoded, XlaCollectiveConfig* out);
};

}  // namespace tfring

#endif  // TFRING_TENSORFLOW_XLA_COLLECTIVE_CONFIG_H
