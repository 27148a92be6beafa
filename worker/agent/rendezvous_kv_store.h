// File: worker/agent/rendezvous_kv_store.h
//
// `RendezvousKvStore`: a comm::KvStore over the coordinator's RendezvousService
// (proto/switchyard/v1/worker.proto), scoped to one (job, generation), so that the Gloo and
// NCCL rendezvous of a generation meet through the coordinator instead of a shared directory.
//
//   Set(key, value)   -> RendezvousService.Set(job, generation, key, value)
//   Get(key, timeout) -> RendezvousService.Get(job, generation, key, timeout_ms), issued in
//                        slices of at most `Options::get_slice` so that Cancel() takes effect
//                        within one slice and a coordinator restart in the middle of a wait is
//                        survived (UNAVAILABLE is retried until the caller's timeout).
//   Check(key)        -> Get with timeout_ms = 0: present, or absent on DEADLINE_EXCEEDED /
//                        NOT_FOUND.
//   Increment, Count  -> UNIMPLEMENTED. The service offers Set/Get only; an atomic counter cannot
//                        be built from last-writer-wins Set and Get without a compare-and-set.
//                        Nothing in the worker needs one: the Gloo store adapter
//                        (comm/gloo_communicator.cc) uses set/get/wait, the NCCL factory Set/Get
//                        of the unique id, comm::PeerMonitor Set/Get/Check.
//
// FAILED_PRECONDITION from the coordinator (the generation is not running: it ended, a newer one
// started or the job ended) and PERMISSION_DENIED (the coordinator does not count this worker as
// a rank of it, e.g. after a coordinator restart before this worker re-registered) become
// ABORTED, so that the rank exits retryable (128+), not as a permanent error of the job.
//
// Errors name the key, the job and generation, and the coordinator ("rendezvous store at
// host:port (job j, generation 3)"). Get's DEADLINE_EXCEEDED names the key, as KvStore requires.
// Thread-safe (a gRPC stub is); Cancel() from any thread.
#ifndef SWITCHYARD_WORKER_AGENT_RENDEZVOUS_KV_STORE_H_
#define SWITCHYARD_WORKER_AGENT_RENDEZVOUS_KV_STORE_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "switchyard/v1/worker.grpc.pb.h"
#include "worker/comm/kv_store.h"

namespace switchyard::agent {

class RendezvousKvStore final : public comm::KvStore {
 public:
  struct Options {
    // Longest single Get RPC; a longer wait is several RPCs. > 0.
    absl::Duration get_slice = absl::Milliseconds(500);
    // Deadline of one RPC beyond the server-side wait it asks for. > 0.
    absl::Duration rpc_slack = absl::Seconds(5);
    // Set retries an UNAVAILABLE coordinator (restarting) for this long. >= 0.
    absl::Duration set_retry_for = absl::Seconds(30);
    // This worker's id, sent with every call: the coordinator serves only the ranks of the
    // generation (PERMISSION_DENIED otherwise; WORKER_PROTOCOL.md "Rendezvous").
    std::string worker_id;
  };

  // `channel` to the coordinator (coordinator_channel.h), `token` its bearer token (may be
  // empty), `address` only for messages. INVALID_ARGUMENT for a null channel, an empty job, a
  // generation < 1 or bad options, naming the field.
  static absl::StatusOr<std::unique_ptr<RendezvousKvStore>> Create(
      std::shared_ptr<grpc::Channel> channel, std::string token, std::string address,
      std::string job, int64_t generation, Options options);
  static absl::StatusOr<std::unique_ptr<RendezvousKvStore>> Create(
      std::shared_ptr<grpc::Channel> channel, std::string token, std::string address,
      std::string job, int64_t generation) {
    return Create(std::move(channel), std::move(token), std::move(address), std::move(job),
                  generation, Options());
  }
  RendezvousKvStore(const RendezvousKvStore&) = delete;
  RendezvousKvStore& operator=(const RendezvousKvStore&) = delete;

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  absl::StatusOr<bool> Check(absl::string_view key) override;
  absl::StatusOr<int64_t> Increment(absl::string_view key) override;
  absl::StatusOr<int64_t> Count(absl::string_view key) override;
  std::string Describe() const override;

  // Makes every pending and later Set/Get/Check fail with CANCELLED (within one get_slice): a
  // rank waiting for peers at rendezvous is released when its generation is stopped. Any thread.
  void Cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

 private:
  RendezvousKvStore(std::shared_ptr<grpc::Channel> channel, std::string token, std::string address,
                    std::string job, int64_t generation, Options options);
  // A Set or Get request scoped to this store's job, generation and worker, for `key`.
  template <typename Request>
  Request NewRequest(absl::string_view key) const;
  // The bearer token, and a deadline `wait` (the server-side wait asked for) + rpc_slack away.
  void PrepareContext(grpc::ClientContext* context, absl::Duration wait) const;
  // One Get RPC asking the server to wait up to `wait`.
  absl::StatusOr<std::string> GetOnce(absl::string_view key, absl::Duration wait);
  absl::Status CancelledError(absl::string_view op, absl::string_view key) const;

  std::unique_ptr<v1::RendezvousService::Stub> stub_;
  const std::string token_, address_, job_;
  const int64_t generation_;
  const Options options_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace switchyard::agent

#endif  // SWITCHYARD_WORKER_AGENT_RENDEZVOUS_KV_STORE_H_
