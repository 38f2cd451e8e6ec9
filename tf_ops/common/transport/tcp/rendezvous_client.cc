#include "rendezvous_client.h"

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>

#include "sha256.h"

namespace tfring {
namespace tcp {

const char kRendezvousContext[] = "rendezvous";

namespace {

uint32_t Millis(double seconds) {
  double ms = std::max(0.0, std::min(seconds * 1000.0, 24.0 * 3600 * 1000));
  return uint32_t(ms);
}

WireStatus NotConnected() {
  return WireStatus::Error(WireCause::PEER_CLOSED, "the rendezvous client is not connected");
}

}  // namespace

WireStatus ClientHandshake(const Socket& s, const std::string& secret,
                           const std::string& context, Deadline deadline) {
  // Before the peer has proved itself, frames are tiny: a hostile server
  // cannot make this side allocate more than kMaxHandshakeFrame.
  FrameParser parser(kMaxHandshakeFrame);
  Frame f;
  TFRING_WIRE_RETURN_IF_ERROR(ReadFrame(s, &parser, deadline, 1e9, &f));
  Challenge ch;
  TFRING_WIRE_RETURN_IF_ERROR(ParseChallenge(f, &ch));
  std::string client_nonce;
  TFRING_WIRE_RETURN_IF_ERROR(RandomBytes(kNonceBytes, &client_nonce));
  std::string mac = ClientMac(secret, ch.nonce, client_nonce, context);
  TFRING_WIRE_RETURN_IF_ERROR(
      SendAll(s, Writer(kAuth).Raw(client_nonce).Bytes(context).Raw(mac).Frame(), deadline));
  TFRING_WIRE_RETURN_IF_ERROR(ReadFrame(s, &parser, deadline, 1e9, &f));
  if (f.type == kError) {
    WireStatus refused = UnexpectedReply(f, kAuthOk);
    return refused.Context("the server refused the connection");
  }
  std::string server_mac;
  TFRING_WIRE_RETURN_IF_ERROR(ParseAuthOk(f, &server_mac));
  std::string expected = ServerMac(secret, ch.nonce, client_nonce, context);
  if (!ConstantTimeEqual(server_mac.data(), expected.data(), kMacBytes)) {
    return WireStatus::Error(WireCause::AUTH_FAILED,
                             "the server's proof is wrong: it does not hold this job's secret");
  }
  return WireStatus::OK();
}

WireStatus RendezvousClient::Connect(const std::string& host, int port,
                                     const std::string& secret, double timeout) {
  where_ = "rendezvous " + host + ":" + std::to_string(port);
  timeout_ = timeout;
  parser_ = FrameParser(kMaxFrame);
  if (secret.size() < kMinSecretBytes) {
    return WireStatus::Error(WireCause::INVALID_ARGUMENT,
                             "the secret must hold at least " + std::to_string(kMinSecretBytes) +
                                 " bytes")
        .Context(where_);
  }
  Deadline deadline = After(timeout);
  WireStatus s = tcp::Connect(host, port, deadline, &sock_);
  if (s.ok()) s = ClientHandshake(sock_, secret, kRendezvousContext, deadline);
  if (!s.ok()) sock_.Close();
  return s.Context(where_);
}

std::string RendezvousClient::LocalAddress() const {
  sockaddr_storage addr;
  socklen_t len = sizeof(addr);
  if (!sock_.valid() || getsockname(sock_.fd(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return "";
  }
  char host[NI_MAXHOST] = {0};
  if (getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof(host), nullptr, 0,
                  NI_NUMERICHOST) != 0) {
    return "";
  }
  return host;
}

WireStatus RendezvousClient::Call(const std::string& frame, double wait, Frame* reply) {
  if (!sock_.valid()) return NotConnected().Context(where_);
  WireStatus s = SendAll(sock_, frame, After(timeout_));
  if (s.ok()) s = ReadFrame(sock_, &parser_, After(wait + timeout_), timeout_, reply);
  // A reply that did not arrive whole leaves the stream out of step: the
  // connection cannot carry another request.
  if (!s.ok()) sock_.Close();
  return s;
}

WireStatus RendezvousClient::Set(const std::string& scope, const std::string& key,
                                 const std::string& value, bool exclusive) {
  Frame f;
  std::string req =
      Writer(kSet).Bytes(scope).Bytes(key).Bytes(value).U8(exclusive ? 1 : 0).Frame();
  WireStatus s = Call(req, 0, &f);
  if (s.ok() && f.type != kOk) s = UnexpectedReply(f, kOk);
  return s.Context(where_ + ": set '" + key + "'");
}

WireStatus RendezvousClient::Get(const std::string& scope, const std::string& key,
                                 double timeout, std::string* value) {
  Frame f;
  WireStatus s =
      Call(Writer(kGet).Bytes(scope).Bytes(key).U32(Millis(timeout)).Frame(), timeout, &f);
  if (s.ok()) s = ParseValue(f, value);
  return s.Context(where_ + ": get '" + key + "'");
}

WireStatus RendezvousClient::Add(const std::string& scope, const std::string& key, int64_t delta,
                                 int64_t* result) {
  Frame f;
  WireStatus s = Call(Writer(kAdd).Bytes(scope).Bytes(key).I64(delta).Frame(), 0, &f);
  if (s.ok()) s = ParseInt(f, result);
  return s.Context(where_ + ": add to '" + key + "'");
}

WireStatus RendezvousClient::Wait(const std::string& scope, const std::vector<std::string>& keys,
                                  double timeout) {
  Writer w(kWaitKeys);
  w.Bytes(scope).U32(uint32_t(keys.size()));
  for (const auto& k : keys) w.Bytes(k);
  Frame f;
  WireStatus s = Call(w.U32(Millis(timeout)).Frame(), timeout, &f);
  if (s.ok() && f.type != kOk) s = UnexpectedReply(f, kOk);
  return s.Context(where_ + ": wait");
}

WireStatus RendezvousClient::WaitPrefix(
    const std::string& scope, const std::string& prefix, uint32_t count, double timeout,
    std::vector<std::pair<std::string, std::string>>* entries) {
  Frame f;
  WireStatus s = Call(
      Writer(kWaitPrefix).Bytes(scope).Bytes(prefix).U32(count).U32(Millis(timeout)).Frame(),
      timeout, &f);
  if (s.ok()) s = ParseEntries(f, entries);
  return s.Context(where_ + ": wait for " + std::to_string(count) + " keys '" + prefix + "*'");
}

WireStatus RendezvousClient::DeleteScope(const std::string& scope) {
  Frame f;
  WireStatus s = Call(Writer(kDeleteScope).Bytes(scope).Frame(), 0, &f);
  if (s.ok() && f.type != kOk) s = UnexpectedReply(f, kOk);
  return s.Context(where_ + ": delete scope '" + scope + "'");
}

WireStatus RendezvousClient::Ping() {
  Frame f;
  WireStatus s = Call(Writer(kPing).Frame(), 0, &f);
  if (s.ok() && f.type != kOk) s = UnexpectedReply(f, kOk);
  return s.Context(where_ + ": ping");
}

}  // namespace tcp
}  // namespace tfring
