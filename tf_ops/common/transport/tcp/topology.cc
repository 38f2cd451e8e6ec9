#include "topology.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <map>
#include <set>
#include <tuple>

namespace tfring {
namespace tcp {
namespace {

const char* const kFields[] = {"host", "pid", "addr", "slot", "order"};

WireStatus Invalid(std::string m) {
  return WireStatus::Error(WireCause::INVALID_ARGUMENT, std::move(m));
}

bool ParseInt64(const std::string& s, int64_t* v) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size()) return false;
  *v = x;
  return true;
}

}  // namespace

std::string EncodeRegistration(const Registration& r) {
  return "v1\nhost=" + r.host + "\npid=" + std::to_string(r.pid) + "\naddr=" + r.addr +
         "\nslot=" + std::to_string(r.slot) + "\norder=" + std::to_string(r.order) + "\n";
}

WireStatus DecodeRegistration(const std::string& data, const std::string& key,
                              Registration* out) {
  if (data.compare(0, 3, "v1\n") != 0 || data.back() != '\n') {
    return Invalid("registration '" + key + "' is not a v1 record");
  }
  std::map<std::string, std::string> fields;
  size_t pos = 3;
  while (pos < data.size()) {
    size_t nl = data.find('\n', pos);
    std::string line = data.substr(pos, nl - pos);
    pos = nl + 1;
    size_t eq = line.find('=');
    std::string name = eq == std::string::npos ? "" : line.substr(0, eq);
    bool known = std::find(std::begin(kFields), std::end(kFields), name) != std::end(kFields);
    if (!known || fields.count(name)) {
      return Invalid("registration '" + key + "' has a bad line '" + line + "'");
    }
    fields[name] = line.substr(eq + 1);
  }
  for (const char* f : kFields) {
    if (!fields.count(f)) return Invalid("registration '" + key + "' lacks " + f);
  }
  Registration r;
  r.host = fields["host"];
  r.addr = fields["addr"];
  if (!ParseInt64(fields["pid"], &r.pid) || !ParseInt64(fields["slot"], &r.slot) ||
      !ParseInt64(fields["order"], &r.order)) {
    return Invalid("registration '" + key + "': pid, slot and order must be integers");
  }
  *out = r;
  return WireStatus::OK();
}

WireStatus DeriveTopology(const std::vector<Registration>& regs, std::vector<RankInfo>* out) {
  if (regs.empty()) return Invalid("no rank registered");
  std::map<std::string, std::vector<const Registration*>> by_host;
  for (const Registration& r : regs) {
    if (r.slot < 0) {
      return Invalid("host '" + r.host + "' registered a negative slot " + std::to_string(r.slot));
    }
    by_host[r.host].push_back(&r);
  }
  std::map<std::string, int64_t> order;
  for (auto& kv : by_host) {
    std::set<int64_t> hints, slots;
    for (const Registration* r : kv.second) {
      hints.insert(r->order);
      if (!slots.insert(r->slot).second) {
        return Invalid("host '" + kv.first + "' has more than one rank in slot(s) [" +
                       std::to_string(r->slot) + "]");
      }
    }
    if (hints.size() > 1) {
      return Invalid("host '" + kv.first + "' registered with different order hints");
    }
    order[kv.first] = *hints.begin();
    std::sort(kv.second.begin(), kv.second.end(),
              [](const Registration* a, const Registration* b) { return a->slot < b->slot; });
  }
  std::vector<std::string> hosts;
  for (const auto& kv : by_host) hosts.push_back(kv.first);
  // -1 (no launcher) sorts after every launcher-given index; then by name.
  std::sort(hosts.begin(), hosts.end(), [&](const std::string& a, const std::string& b) {
    auto ka = std::make_tuple(order[a] < 0, order[a], a);
    auto kb = std::make_tuple(order[b] < 0, order[b], b);
    return ka < kb;
  });
  std::map<int, int> per_local, seen_local;
  for (const auto& h : hosts) {
    for (size_t i = 0; i < by_host[h].size(); ++i) per_local[int(i)]++;
  }
  out->clear();
  for (const auto& h : hosts) {
    const auto& list = by_host[h];
    for (size_t i = 0; i < list.size(); ++i) {
      RankInfo info;
      info.rank = int(out->size());
      info.size = int(regs.size());
      info.local_rank = int(i);
      info.local_size = int(list.size());
      info.cross_rank = seen_local[int(i)]++;
      info.cross_size = per_local[int(i)];
      info.reg = *list[i];
      out->push_back(info);
    }
  }
  return WireStatus::OK();
}

}  // namespace tcp
}  // namespace tfring
