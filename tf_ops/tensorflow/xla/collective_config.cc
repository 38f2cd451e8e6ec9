#include "collective_config.h"

#include <cstdio>
#include <cstring>
#include <sstream>

namespace tfring {

namespace {

constexpr char kVersion[] = "tfring-xla-1";

std::string Hex(const std::string& raw) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(raw.size() * 2);
  for (unsigned char c : raw) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

bool Unhex(const std::string& hex, std::string* raw) {
  if (hex.size() % 2) return false;
  auto value = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
  };
  raw->clear();
  for (size_t i = 0; i < hex.size(); i += 2) {
    int hi = value(hex[i]), lo = value(hex[i + 1]);
    if (hi < 0 || lo < 0) return false;
    raw->push_back(static_cast<char>(hi * 16 + lo));
  }
  return true;
}

std::string Exact(double v) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

}  // namespace

std::string XlaCollectiveConfig::Encode() const {
  std::ostringstream os;
  os << kVersion << ' ' << static_cast<int>(type) << ' ' << process_set_id << ' '
     << static_cast<int>(reduce_op) << ' ' << Exact(prescale_factor) << ' '
     << Exact(postscale_factor) << ' ' << root_rank << ' ' << (grouped ? 1 : 0) << ' '
     << dtypes.size();
  for (size_t i = 0; i < dtypes.size(); ++i) {
    os << ' ' << static_cast<int>(dtypes[i]) << ' ' << shapes[i].size();
    for (int64_t d : shapes[i]) os << ' ' << d;
  }
  // Last, as the rest of the string: a name may hold spaces.
  os << ' ' << name;
  return Hex(os.str());
}

Status XlaCollectiveConfig::Decode(const std::string& encoded, XlaCollectiveConfig* out) {
  const Status bad = Status::Unknown(
      "tfring: malformed XLA custom call configuration (was the step compiled by another "
      "tfring version?)");
  std::string raw;
  if (!Unhex(encoded, &raw)) return bad;
  std::istringstream is(raw);
  std::string version;
  int type = 0, op = 0, grouped = 0;
  size_t n = 0;
  XlaCollectiveConfig c;
  if (!(is >> version) || version != kVersion ||
      !(is >> type >> c.process_set_id >> op >> c.prescale_factor >> c.postscale_factor >>
        c.root_rank >> grouped >> n)) {
    return bad;
  }
  for (size_t i = 0; i < n; ++i) {
    int dtype = 0;
    size_t rank = 0;
    if (!(is >> dtype >> rank)) return bad;
    TensorShape shape(rank);
    for (auto& d : shape)
      if (!(is >> d)) return bad;
    c.dtypes.push_back(static_cast<DataType>(dtype));
    c.shapes.push_back(std::move(shape));
  }
  if (is.get() != ' ') return bad;
  std::getline(is, c.name, '\0');
  if (c.name.empty()) return bad;
  c.type = static_cast<CollectiveType>(type);
  c.reduce_op = static_cast<ReduceOp>(op);
  c.grouped = grouped != 0;
  *out = std::move(c);
  return Status::OK();
}

}  // namespace tfring
