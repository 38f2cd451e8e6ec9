#include "peer_frame.h"

namespace tfring {
namespace tcp {

const char kPeerContext[] = "tfring-peer";

namespace {

WireStatus Protocol(std::string m) {
  return WireStatus::Error(WireCause::PROTOCOL_ERROR, std::move(m));
}

Reader BodyOf(const Frame& f) {
  return Reader(reinterpret_cast<const uint8_t*>(f.body.data()), f.body.size());
}

uint64_t Load64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return v;
}

void Store64(uint64_t v, uint8_t* p) {
  for (int i = 7; i >= 0; --i) {
    p[i] = uint8_t(v);
    v >>= 8;
  }
}

}  // namespace

std::string EncodeHello(const Hello& h) {
  return Writer(kHello).U32(h.client_rank).U32(h.server_rank).U32(h.size).Frame();
}

WireStatus ParseHello(const Frame& f, Hello* out) {
  if (f.type != kHello) return UnexpectedReply(f, kHello);
  Reader r = BodyOf(f);
  TFRING_WIRE_RETURN_IF_ERROR(r.U32(&out->client_rank));
  TFRING_WIRE_RETURN_IF_ERROR(r.U32(&out->server_rank));
  TFRING_WIRE_RETURN_IF_ERROR(r.U32(&out->size));
  return r.End();
}

std::string EncodeHelloOk(uint32_t server_rank) {
  return Writer(kHelloOk).U32(server_rank).Frame();
}

WireStatus ParseHelloOk(const Frame& f, uint32_t* server_rank) {
  if (f.type != kHelloOk) return UnexpectedReply(f, kHelloOk);
  Reader r = BodyOf(f);
  TFRING_WIRE_RETURN_IF_ERROR(r.U32(server_rank));
  return r.End();
}

void EncodePeerHeader(const PeerHeader& h, uint8_t out[kPeerHeaderBytes]) {
  out[0] = uint8_t(h.kind);
  out[1] = out[2] = out[3] = 0;
  uint32_t tag = uint32_t(h.tag);
  for (int i = 0; i < 4; ++i) out[4 + i] = uint8_t(tag >> (24 - 8 * i));
  Store64(h.context, out + 8);
  Store64(h.length, out + 16);
}

WireStatus ParsePeerHeader(const uint8_t in[kPeerHeaderBytes], PeerHeader* out) {
  uint8_t kind = in[0];
  if (kind < uint8_t(PeerFrameKind::DATA) || kind > uint8_t(PeerFrameKind::ABORT)) {
    return Protocol("unknown frame kind " + std::to_string(kind) + " from a peer");
  }
  if (in[1] != 0 || in[2] != 0 || in[3] != 0) {
    return Protocol("a peer frame header has non-zero reserved bytes");
  }
  uint32_t tag = 0;
  for (int i = 0; i < 4; ++i) tag = (tag << 8) | in[4 + i];
  uint64_t length = Load64(in + 16);
  if (length > kMaxPeerMessage) {
    return Protocol("a peer announced a message of " + std::to_string(length) +
                    " bytes, above the limit of " + std::to_string(kMaxPeerMessage));
  }
  if (kind == uint8_t(PeerFrameKind::ABORT) && length > kMaxAbortBody) {
    return Protocol("a peer's ABORT notice claims " + std::to_string(length) +
                    " bytes, above the limit of " + std::to_string(kMaxAbortBody));
  }
  if (kind != uint8_t(PeerFrameKind::DATA) && kind != uint8_t(PeerFrameKind::ABORT) &&
      length != 0) {
    return Protocol("a peer's control frame (kind " + std::to_string(kind) +
                    ") carries a payload of " + std::to_string(length) + " bytes");
  }
  out->kind = PeerFrameKind(kind);
  out->tag = int32_t(tag);
  out->context = Load64(in + 8);
  out->length = length;
  return WireStatus::OK();
}

std::string EncodeAbort(const AbortNotice& a) {
  std::string body = Writer(0).U32(a.failed_rank).U8(a.cause).Bytes(
      a.detail.substr(0, kMaxAbortBody - 16)).Frame();
  return body.substr(5);  // the fields only: no frame length, no type byte
}

WireStatus ParseAbort(const std::string& body, AbortNotice* out) {
  Reader r(reinterpret_cast<const uint8_t*>(body.data()), body.size());
  TFRING_WIRE_RETURN_IF_ERROR(r.U32(&out->failed_rank));
  TFRING_WIRE_RETURN_IF_ERROR(r.U8(&out->cause));
  TFRING_WIRE_RETURN_IF_ERROR(r.Bytes(&out->detail, kMaxAbortBody));
  return r.End();
}

}  // namespace tcp
}  // namespace tfring
