#include "convert.h"

#include <string>
#include <vector>

#include "absl/strings/cord.h"
#include "tensorflow/core/platform/errors.h"

#include "../common/operations.h"

namespace tfring {

namespace tf = ::tensorflow;

namespace {
// The payload that carries a failure's cause and rank to Python, where
// TensorFlow hands it over as the exception's `experimental_payloads`
// (tfring/common/status.py reads it back). Its value: "CAUSE RANK".
constexpr char kFailurePayload[] = "tfring.failure";
}  // namespace

tf::Status ToTFStatus(const Status& s) {
  tf::Status out;
  switch (s.code()) {
    case StatusCode::OK: return tf::OkStatus();
    case StatusCode::PRECONDITION_ERROR: out = tf::errors::FailedPrecondition(s.message()); break;
    case StatusCode::ABORTED: out = tf::errors::Aborted(s.message()); break;
    case StatusCode::INVALID_ARGUMENT: out = tf::errors::InvalidArgument(s.message()); break;
    default: out = tf::errors::Unknown(s.message()); break;
  }
  // From a string_view: the Cord constructor TensorFlow's library exports.
  const std::string value =
      std::to_string(static_cast<int>(s.cause())) + " " + std::to_string(s.rank());
  out.SetPayload(kFailurePayload, absl::Cord(absl::string_view(value)));
  return out;
}

Status FromTFStatus(const tf::Status& s) {
  if (s.ok()) return Status::OK();
  return Status::Unknown(std::string(s.message()));
}

Status ToCoreType(tf::DataType dt, DataType* out) {
  switch (dt) {
    case tf::DT_UINT8: *out = DataType::UINT8; break;
    case tf::DT_INT8: *out = DataType::INT8; break;
    case tf::DT_UINT16: *out = DataType::UINT16; break;
    case tf::DT_INT16: *out = DataType::INT16; break;
    case tf::DT_INT32: *out = DataType::INT32; break;
    case tf::DT_INT64: *out = DataType::INT64; break;
    case tf::DT_HALF: *out = DataType::FLOAT16; break;
    case tf::DT_BFLOAT16: *out = DataType::BFLOAT16; break;
    case tf::DT_FLOAT: *out = DataType::FLOAT32; break;
    case tf::DT_DOUBLE: *out = DataType::FLOAT64; break;
    case tf::DT_BOOL: *out = DataType::BOOL; break;
    default:
      return Status::InvalidArgument("tfring: collectives do not support dtype " +
                                     tf::DataTypeString(dt));
  }
  return Status::OK();
}

TensorShape ToCoreShape(const tf::TensorShape& s) {
  TensorShape out;
  out.reserve(s.dims());
  for (int i = 0; i < s.dims(); ++i) out.push_back(s.dim_size(i));
  return out;
}

tf::TensorShape ToTFShape(const TensorShape& s) {
  tf::TensorShape out;
  for (int64_t d : s) out.AddDim(d);
  return out;
}

std::string CollectiveKey(const std::string& node_name, const std::string& tensor_name,
                          bool ignore_name_scope) {
  if (!tensor_name.empty()) return tensor_name;
  if (!ignore_name_scope) return node_name;
  auto pos = node_name.rfind('/');
  return pos == std::string::npos ? node_name : node_name.substr(pos + 1);
}

std::string EntryName(const std::string& key, int n, bool grouped, int i) {
  return n > 1 || grouped ? key + "_" + std::to_string(i) : key;
}

int SetSize(int id) {
  int rank;
  std::vector<int> ranks;
  return GetProcessSet(id, &rank, &ranks).ok() ? static_cast<int>(ranks.size()) : -1;
}
int SetRank(int id) {
  int rank;
  std::vector<int> ranks;
  return GetProcessSet(id, &rank, &ranks).ok() ? rank : -1;
}
int SetIncluded(int id) { return SetRank(id) >= 0 ? 1 : 0; }
int QueryLocalSize(int) { return LocalSize(); }
int QueryLocalRank(int) { return LocalRank(); }

}  // namespace tfring
