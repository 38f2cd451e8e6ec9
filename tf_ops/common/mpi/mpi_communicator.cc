#include "mpi_communicator.h"

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

namespace tfring {
namespace {

// MPI counts are ints: a larger message travels as consecutive pieces of at
// most this many bytes. Both sides cut it the same way (a receive names the
// exact size of its message), and MPI keeps messages between two ranks with
// one tag in order, so the pieces of one message and of successive messages
// match up.
constexpr int64_t kMaxPiece = int64_t{1} << 30;

class MPIRequest : public CommRequest {
 public:
  enum Kind { kSend, kRecv, kCollective };
  explicit MPIRequest(Kind kind) : kind_(kind) {}
  ~MPIRequest() override { Abandon(); }

  // Frees what is still pending. A receive is cancelled first so that no late
  // message lands in a buffer its owner reuses; a send is only released (MPI
  // finishes or drops it); a collective cannot be cancelled and is left.
  void Abandon() {
    if (kind_ == kCollective) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (size_t i = next_; i < reqs_.size(); ++i) {
      if (reqs_[i] == MPI_REQUEST_NULL) continue;
      if (kind_ == kRecv) MPI_Cancel(&reqs_[i]);
      MPI_Request_free(&reqs_[i]);
    }
    next_ = reqs_.size();
  }

  Kind kind_;
  std::vector<MPI_Request> reqs_;
  std::vector<int> bytes_;  // expected size of each piece (receives)
  size_t next_ = 0;         // pieces before this one are done
  int peer_ = -1;
};

}  // namespace

MPICommunicator::MPICommunicator(MPI_Comm comm, std::shared_ptr<PeerMonitor> monitor)
    : comm_(comm) {
  set_monitor(std::move(monitor));
  if (comm_ != MPI_COMM_NULL) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    int* ub = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(comm_, MPI_TAG_UB, &ub, &flag);
    if (flag && ub != nullptr && *ub > max_tag_) max_tag_ = *ub;
  }
}

MPICommunicator::~MPICommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

Status MPIStatus(int code, const char* what) {
  if (code == MPI_SUCCESS) return Status::OK();
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, msg, &len);
  return Status::Aborted(std::string("tfring: MPI ") + what + " failed: " + std::string(msg, len));
}

Status MPICommunicator::Isend(const void* buf, int64_t bytes, int peer, int tag,
                              CommRequestPtr* out) {
  std::unique_ptr<MPIRequest> req(new MPIRequest(MPIRequest::kSend));
  req->peer_ = peer;
  const char* p = static_cast<const char*>(buf);
  int64_t done = 0;
  do {
    const int n = static_cast<int>(std::min(bytes - done, kMaxPiece));
    req->reqs_.push_back(MPI_REQUEST_NULL);
    // On error the pieces already posted are freed with `req`.
    TFRING_RETURN_IF_ERROR(MPIStatus(
        MPI_Isend(p + done, n, MPI_BYTE, peer, tag, comm_, &req->reqs_.back()), "Isend"));
    done += n;
  } while (done < bytes);
  *out = std::move(req);
  return Status::OK();
}

Status MPICommunicator::Irecv(void* buf, int64_t bytes, int peer, int tag, CommRequestPtr* out) {
  std::unique_ptr<MPIRequest> req(new MPIRequest(MPIRequest::kRecv));
  req->peer_ = peer;
  char* p = static_cast<char*>(buf);
  int64_t done = 0;
  do {
    const int n = static_cast<int>(std::min(bytes - done, kMaxPiece));
    req->reqs_.push_back(MPI_REQUEST_NULL);
    req->bytes_.push_back(n);
    TFRING_RETURN_IF_ERROR(MPIStatus(
        MPI_Irecv(p + done, n, MPI_BYTE, peer, tag, comm_, &req->reqs_.back()), "Irecv"));
    done += n;
  } while (done < bytes);
  *out = std::move(req);
  return Status::OK();
}

Status MPICommunicator::Test(CommRequest* base, bool* done) {
  *done = true;
  if (base == nullptr) return Status::OK();
  auto* req = static_cast<MPIRequest*>(base);
  while (req->next_ < req->reqs_.size()) {
    MPI_Status status;
    int flag = 0;
    MPI_Request& r = req->reqs_[req->next_];
    const int rc = MPI_Test(&r, &flag, &status);
    if (rc != MPI_SUCCESS) {
      return MPIStatus(rc, req->kind_ == MPIRequest::kSend
                               ? "Isend"
                               : req->kind_ == MPIRequest::kRecv ? "Irecv" : "Test");
    }
    if (!flag) {
      *done = false;
      return Status::OK();
    }
    if (req->kind_ == MPIRequest::kRecv) {
      int count = 0;
      MPI_Get_count(&status, MPI_BYTE, &count);
      const int want = req->bytes_[req->next_];
      if (count != want) {
        ++req->next_;
        req->Abandon();
        return Status::Aborted("tfring: rank " + std::to_string(req->peer_) + " sent " +
                               std::to_string(count) + " bytes where rank " +
                               std::to_string(rank_) + " expected " + std::to_string(want) +
                               " (MPI message of tag " + std::to_string(status.MPI_TAG) + ")");
      }
    }
    ++req->next_;
  }
  return Status::OK();
}

void MPICommunicator::Cancel(CommRequestPtr* req) {
  if (*req) static_cast<MPIRequest*>(req->get())->Abandon();
  req->reset();
}

Status MPICommunicator::Split(int color, int key, std::shared_ptr<Communicator>* out) {
  MPI_Comm split = MPI_COMM_NULL;
  TFRING_RETURN_IF_ERROR(MPIStatus(
      MPI_Comm_split(comm_, color >= 0 ? color : MPI_UNDEFINED, key, &split), "Comm_split"));
  if (split == MPI_COMM_NULL) {
    out->reset();
  } else {
    *out = std::make_shared<MPICommunicator>(split, monitor());
  }
  return Status::OK();
}

Status MPICommunicator::Dup(std::shared_ptr<Communicator>* out) {
  MPI_Comm dup = MPI_COMM_NULL;
  TFRING_RETURN_IF_ERROR(MPIStatus(MPI_Comm_dup(comm_, &dup), "Comm_dup"));
  *out = std::make_shared<MPICommunicator>(dup, monitor());
  return Status::OK();
}

Status MPICommunicator::Wait(MPI_Request* request, const char* what, bool spin) {
  MPIRequest req(MPIRequest::kCollective);
  req.reqs_.push_back(*request);
  Status s = Communicator::Wait(&req, what, spin);
  *request = req.reqs_[0];
  return s;
}

}  // namespace tfring
