#include "message.h"

#include <cstring>

namespace tfring {

RequestPool::RequestPool() { spares_.reserve(kMaxSpares); }

Request RequestPool::Copy(const Request& from) {
  Request r;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!spares_.empty()) {
      r = std::move(spares_.back());
      spares_.pop_back();
    }
  }
  // Copy-assignment keeps the spare's vectors and strings where they fit.
  r = from;
  return r;
}

void RequestPool::Give(Request&& done) {
  std::lock_guard<std::mutex> lock(mu_);
  if (spares_.size() < kMaxSpares) spares_.push_back(std::move(done));
}

RequestPool& SpareRequests() {
  // Never destroyed: requests may be given back while the process exits.
  static RequestPool* pool = new RequestPool();
  return *pool;
}

namespace {

// Both ends of a message are the same build on the same architecture, so a
// plain little-endian memcpy layout is enough; the reader bounds-checks every
// field so a truncated message is an error, not a crash.
class Writer {
 public:
  template <typename T>
  void Pod(T v) {
    buf_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  void Str(const std::string& s) {
    Pod<uint64_t>(s.size());
    buf_.append(s);
  }
  template <typename T>
  void Ints(const std::vector<T>& v) {
    Pod<uint64_t>(v.size());
    buf_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  std::string Take() { return std::move(buf_); }

 private:
  std::string buf_;
};

class Reader {
 public:
  explicit Reader(const std::string& b) : buf_(b) {}
  template <typename T>
  bool Pod(T* v) {
    if (pos_ + sizeof(T) > buf_.size()) return false;
    std::memcpy(v, buf_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool Str(std::string* s) {
    uint64_t n;
    if (!Pod(&n) || n > buf_.size() - pos_) return false;
    s->assign(buf_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  template <typename T>
  bool Ints(std::vector<T>* v) {
    uint64_t n;
    if (!Pod(&n) || n > (buf_.size() - pos_) / sizeof(T)) return false;
    v->resize(n);
    if (n) std::memcpy(v->data(), buf_.data() + pos_, n * sizeof(T));
    pos_ += n * sizeof(T);
    return true;
  }
  bool Done() const { return pos_ == buf_.size(); }

 private:
  const std::string& buf_;
  size_t pos_ = 0;
};

constexpr uint32_t kRequestMagic = 0x54465251;   // "TFRQ"
constexpr uint32_t kResponseMagic = 0x54465253;  // "TFRS"

}  // namespace

bool Request::operator==(const Request& o) const {
  return request_rank == o.request_rank && type == o.type && dtype == o.dtype &&
         name == o.name && root_rank == o.root_rank && reduce_op == o.reduce_op &&
         prescale_factor == o.prescale_factor && postscale_factor == o.postscale_factor &&
         shape == o.shape && splits == o.splits && group_name == o.group_name &&
         group_size == o.group_size && group_index == o.group_index && device == o.device &&
         same_rows == o.same_rows && abandoned == o.abandoned;
}

bool Response::operator==(const Response& o) const {
  return type == o.type && collective == o.collective && tensor_names == o.tensor_names &&
         error_message == o.error_message && error_cause == o.error_cause && dtype == o.dtype && reduce_op == o.reduce_op &&
         prescale_factor == o.prescale_factor && postscale_factor == o.postscale_factor &&
         root_rank == o.root_rank && tensor_sizes == o.tensor_sizes &&
         int_result == o.int_result && ranks == o.ranks && devices == o.devices;
}

std::string SerializeRequestList(const RequestList& list) {
  Writer w;
  w.Pod(kRequestMagic);
  w.Pod<uint8_t>(list.shutdown);
  w.Str(list.shutdown_reason);
  w.Pod(list.shutdown_cause);
  w.Pod(list.shutdown_rank);
  w.Pod<uint64_t>(list.requests.size());
  for (const auto& r : list.requests) {
    w.Pod(r.request_rank);
    w.Pod(static_cast<int32_t>(r.type));
    w.Pod(static_cast<int32_t>(r.dtype));
    w.Str(r.name);
    w.Pod(r.root_rank);
    w.Pod(static_cast<int32_t>(r.reduce_op));
    w.Pod(r.prescale_factor);
    w.Pod(r.postscale_factor);
    w.Ints(r.shape);
    w.Ints(r.splits);
    w.Str(r.group_name);
    w.Pod(r.group_size);
    w.Pod(r.group_index);
    w.Pod(r.device);
    w.Pod<uint8_t>(r.same_rows);
    w.Str(r.abandoned);
  }
  return w.Take();
}

Status ParseRequestList(const std::string& bytes, RequestList* list) {
  Reader rd(bytes);
  uint32_t magic = 0;
  uint8_t shutdown = 0;
  uint64_t n = 0;
  const Status bad = Status::Unknown("tfring: malformed request list received during negotiation");
  if (!rd.Pod(&magic) || magic != kRequestMagic || !rd.Pod(&shutdown) ||
      !rd.Str(&list->shutdown_reason) || !rd.Pod(&list->shutdown_cause) ||
      !rd.Pod(&list->shutdown_rank) || !rd.Pod(&n)) {
    return bad;
  }
  list->shutdown = shutdown != 0;
  list->requests.clear();
  for (uint64_t i = 0; i < n; ++i) {
    Request r;
    int32_t type, dtype, op;
    uint8_t same_rows = 0;
    if (!rd.Pod(&r.request_rank) || !rd.Pod(&type) || !rd.Pod(&dtype) || !rd.Str(&r.name) ||
        !rd.Pod(&r.root_rank) || !rd.Pod(&op) || !rd.Pod(&r.prescale_factor) ||
        !rd.Pod(&r.postscale_factor) || !rd.Ints(&r.shape) || !rd.Ints(&r.splits) ||
        !rd.Str(&r.group_name) || !rd.Pod(&r.group_size) || !rd.Pod(&r.group_index) ||
        !rd.Pod(&r.device) || !rd.Pod(&same_rows) || !rd.Str(&r.abandoned)) {
      return bad;
    }
    r.same_rows = same_rows != 0;
    r.type = static_cast<CollectiveType>(type);
    r.dtype = static_cast<DataType>(dtype);
    r.reduce_op = static_cast<ReduceOp>(op);
    list->requests.push_back(std::move(r));
  }
  return rd.Done() ? Status::OK() : bad;
}

std::string SerializeResponseList(const ResponseList& list) {
  Writer w;
  w.Pod(kResponseMagic);
  w.Pod<uint8_t>(list.shutdown);
  w.Str(list.shutdown_reason);
  w.Pod(list.shutdown_cause);
  w.Pod(list.shutdown_rank);
  w.Pod<uint8_t>(list.has_params);
  w.Pod(list.fusion_threshold_bytes);
  w.Pod(list.cycle_time_ms);
  w.Pod(list.shm_min_bytes);
  w.Pod<uint64_t>(list.responses.size());
  for (const auto& r : list.responses) {
    w.Pod(static_cast<int32_t>(r.type));
    w.Pod(static_cast<int32_t>(r.collective));
    w.Pod<uint64_t>(r.tensor_names.size());
    for (const auto& name : r.tensor_names) w.Str(name);
    w.Str(r.error_message);
    w.Pod(static_cast<int32_t>(r.error_cause));
    w.Pod(static_cast<int32_t>(r.dtype));
    w.Pod(static_cast<int32_t>(r.reduce_op));
    w.Pod(r.prescale_factor);
    w.Pod(r.postscale_factor);
    w.Pod(r.root_rank);
    w.Ints(r.tensor_sizes);
    w.Pod(r.int_result);
    w.Ints(r.ranks);
    w.Ints(r.devices);
  }
  return w.Take();
}

Status ParseResponseList(const std::string& bytes, ResponseList* list) {
  Reader rd(bytes);
  uint32_t magic = 0;
  uint8_t shutdown = 0;
  uint64_t n = 0;
  uint8_t has_params = 0;
  const Status bad = Status::Unknown("tfring: malformed response list received during negotiation");
  if (!rd.Pod(&magic) || magic != kResponseMagic || !rd.Pod(&shutdown) ||
      !rd.Str(&list->shutdown_reason) || !rd.Pod(&list->shutdown_cause) ||
      !rd.Pod(&list->shutdown_rank) || !rd.Pod(&has_params) ||
      !rd.Pod(&list->fusion_threshold_bytes) || !rd.Pod(&list->cycle_time_ms) ||
      !rd.Pod(&list->shm_min_bytes) || !rd.Pod(&n)) {
    return bad;
  }
  list->shutdown = shutdown != 0;
  list->has_params = has_params != 0;
  list->responses.clear();
  for (uint64_t i = 0; i < n; ++i) {
    Response r;
    int32_t type, collective, dtype, op, cause;
    uint64_t names = 0;
    if (!rd.Pod(&type) || !rd.Pod(&collective) || !rd.Pod(&names)) return bad;
    if (names > bytes.size()) return bad;
    r.tensor_names.resize(names);
    for (auto& name : r.tensor_names) {
      if (!rd.Str(&name)) return bad;
    }
    if (!rd.Str(&r.error_message) || !rd.Pod(&cause) || !rd.Pod(&dtype) || !rd.Pod(&op) ||
        !rd.Pod(&r.prescale_factor) || !rd.Pod(&r.postscale_factor) || !rd.Pod(&r.root_rank) ||
        !rd.Ints(&r.tensor_sizes) || !rd.Pod(&r.int_result) || !rd.Ints(&r.ranks) ||
        !rd.Ints(&r.devices)) {
      return bad;
    }
    r.type = static_cast<ResponseType>(type);
    r.error_cause = static_cast<FailureCause>(cause);
    r.collective = static_cast<CollectiveType>(collective);
    r.dtype = static_cast<DataType>(dtype);
    r.reduce_op = static_cast<ReduceOp>(op);
    list->responses.push_back(std::move(r));
  }
  return rd.Done() ? Status::OK() : bad;
}

}  // namespace tfring
