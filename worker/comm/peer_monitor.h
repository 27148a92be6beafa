// File: worker/comm/peer_monitor.h
//
// `PeerMonitor`: tells which ranks of a job are gone, so that a communication error can name the
// lost rank instead of a TCP address (Gloo: "Connection closed by peer [127.0.0.1]:45704") or
// nothing at all (NCCL: DEADLINE_EXCEEDED after the timeout).
//
// How: every rank publishes a heartbeat into the job's rendezvous KvStore (kv_store.h) from a
// background thread every `interval`:
//
//   key   "<prefix>/heartbeat/<rank>"
//   value "<counter> <pid> <hostname> alive|exited"
//
// and the same thread reads every peer's heartbeat. A peer is LOST when its counter has not
// advanced for `grace` as seen by this process's clock (a missing key counts as not advancing).
// Only counters are compared, never timestamps, so hosts need no synchronised clocks. A peer whose
// value says "exited" (its clean Stop()) is never lost. The verdict of LostPeers() always rests on
// a fresh read, so a stalled observer errs toward "alive", never toward blaming a live peer.
//
// Why a separate channel: a dead peer looks different to every transport (Gloo fails at once on a
// closed socket, naming an address; NCCL hangs to its timeout; a rank blocked in a sub-group
// without the dead peer learns nothing until a neighbour gives up), and none of them knows the
// job's ranks. The heartbeat store is shared by all ranks and indexed by rank.
//
// Use (one per rank, next to the ProcessGroups, same store and generation prefix):
//
//   SY_ASSIGN_OR_RETURN(auto monitor, PeerMonitor::Create(store, rank, world, options));
//   absl::StatusOr<StepResult> r = trainer->Step();
//   if (!r.ok()) return monitor->AnnotateFailure(r.status());   // names the lost rank(s)
//   ...
//   monitor->Stop();                                              // normal end: "exited"
//
// Bounded failure (the watchdog): with `on_lost` set, the monitor thread calls it once, as soon as
// it sees a lost peer (about grace + interval after the death), whatever the transport is doing.
// What the callback can achieve depends on the transport's Abort():
// - NcclCommunicator::Abort is documented to make a blocked call fail (ncclCommAbort); not
//   verified here (no GPU on the build machine).
// - GlooCommunicator::Abort signals every pair (tcp::Pair::signalExceptionExternal, see
//   gloo_pair_signal.h), which wakes a collective blocked in the aborting process itself, then
//   closes the connections, which makes the PEERS' operations on them fail at once. (Before it
//   signalled, Gloo's closeConnections alone left the aborting process's own collective waiting
//   for its timeout: killed_peer_test saw two or all three survivors still blocked 5 s after
//   AbortAll; gloo_communicator_test's AbortWakesOwnCollectiveBlockedOnAHungPeer covers it now.)
//   killed_peer_test's callback still ends the process with a retryable exit code (DESIGN.md:
//   128-255) if Step() stays blocked after the abort, as a last resort.
// A live rank whose heartbeat thread is starved for longer than `grace` is declared lost as well
// (there is no way to tell it from a hung one), so keep `grace` well above scheduling hiccups;
// the default 3 x 250 ms suits processes that own their cores.
//
// Stale values: keys of an earlier run under the same prefix look alive at first and are then
// lost (or "exited"); scope the store per job and generation (PrefixedKvStore), as the
// communicators' rendezvous does. A store read error is not evidence: that peer's state is left
// unchanged for that round (a broken store therefore makes peers look silent, and they are
// eventually reported lost; the annotation then carries the store's error).
#ifndef SWITCHYARD_WORKER_COMM_PEER_MONITOR_H_
#define SWITCHYARD_WORKER_COMM_PEER_MONITOR_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/comm/kv_store.h"

namespace switchyard::comm {

struct PeerMonitorOptions {
  // Key prefix inside the store ("<prefix>/heartbeat/<rank>"). Non-empty.
  std::string prefix = "peer_monitor";
  // How often this rank publishes its heartbeat and reads its peers'. > 0.
  absl::Duration interval = absl::Milliseconds(250);
  // A peer is lost when its heartbeat has not advanced for this long. >= 2 x interval: one
  // interval of publishing delay plus one of polling delay must not look like a death.
  // Zero selects 3 x interval.
  absl::Duration grace = absl::ZeroDuration();
  // The ranks this monitor reads and may report (each in [0, world); this rank may be listed and
  // is skipped, so a group's member list can be passed). Empty: every other rank. Every rank
  // publishes regardless. Reading is one store read per watched rank per interval, so in a large
  // job watch the members of this rank's groups (or ring neighbours), not the whole world.
  std::vector<int> watch;
  // Create waits this long for every watched peer's first heartbeat (the monitor's rendezvous).
  absl::Duration startup_timeout = absl::Seconds(60);
  // Called once, from the monitor thread, when a peer is first seen lost (the lost peers are
  // described in the argument, as AnnotateFailure would append it), e.g. ProcessGroups::AbortAll.
  // Must be thread-safe and must not call Stop() or destroy the monitor (it runs on the thread
  // they join); heartbeats pause while it runs. Empty: nothing is called.
  std::function<void(const std::string& verdict)> on_lost;
};

// One lost peer, as LostPeers() reports it.
struct LostPeer {
  int rank = -1;
  int64_t pid = -1;           // from its last heartbeat (-1 if none was ever read)
  std::string hostname;       // idem
  absl::Duration silent_for;  // since this process last saw its counter advance
};

// Owns the heartbeat thread. Not copyable or movable. All methods are thread-safe.
class PeerMonitor {
 public:
  // Publishes the first heartbeat of `rank` in a world of `world` ranks, waits up to
  // options.startup_timeout for every watched peer's first heartbeat, and starts the thread.
  // Collective: every rank calls it with the same store, prefix and world. INVALID_ARGUMENT naming
  // the field and the rule for bad arguments; DEADLINE_EXCEEDED naming the ranks that never showed
  // up.
  static absl::StatusOr<std::unique_ptr<PeerMonitor>> Create(std::shared_ptr<KvStore> store,
                                                             int rank, int world,
                                                             PeerMonitorOptions options = {});
  PeerMonitor(const PeerMonitor&) = delete;
  PeerMonitor& operator=(const PeerMonitor&) = delete;
  // Stop()s (so a rank that ends normally, by error or not, is "exited" to its peers).
  ~PeerMonitor();

  // Reads every watched peer's heartbeat once and returns the lost ones, in rank order.
  std::vector<LostPeer> LostPeers();
  // Ranks of LostPeers().
  std::vector<int> LostRanks();

  // For an error from a collective: when a peer is lost, returns UNAVAILABLE with `status`'s
  // message followed by " (lost rank(s): 1 [pid 42 on host-a], 3 [...]: no heartbeat for 0.8 s)"
  // (the shortest silence of them). Otherwise returns `status` unchanged. OK stays OK.
  // Communication codes (UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED, INTERNAL, UNKNOWN) wait up to
  // grace + 2 x interval for the verdict, because a transport often notices a death before the
  // heartbeat has been silent for `grace`; other codes are checked once, without waiting.
  absl::Status AnnotateFailure(const absl::Status& status);

  // Marks this rank "exited" in the store and ends the thread. Idempotent. A rank that exits
  // without Stop() (killed, or hung) is lost to its peers after `grace`.
  void Stop();

  int rank() const { return rank_; }
  int world() const { return world_; }
  absl::Duration interval() const { return options_.interval; }
  absl::Duration grace() const { return options_.grace; }

 private:
  // Silence is measured on the monotonic clock, so a wall-clock step (NTP) cannot fake a death.
  using Clock = std::chrono::steady_clock;
  struct Peer {
    std::string value;  // last value read ("" = never read)
    int64_t counter = -1;
    int64_t pid = -1;
    std::string hostname;
    bool exited = false;
    Clock::time_point last_change;  // when `counter` was last seen to advance
  };

  PeerMonitor(std::shared_ptr<KvStore> store, int rank, int world, PeerMonitorOptions options,
              std::vector<int> watched);
  std::string Key(int rank) const;
  std::string Value(bool exited) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Publish(bool exited) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads every watched peer's key once (no waiting) and updates `peers_`.
  void Poll() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<LostPeer> Lost(Clock::time_point now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string Verdict(const std::vector<LostPeer>& lost) const;
  void Loop();

  const std::shared_ptr<KvStore> store_;
  const int rank_;
  const int world_;
  const PeerMonitorOptions options_;
  const std::vector<int> watched_;  // sorted, distinct, without rank_
  const int64_t pid_;
  const std::string hostname_;

  absl::Mutex mu_;
  int64_t counter_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool ready_ ABSL_GUARDED_BY(mu_) = false;  // every peer showed up; silence counts from then
  bool on_lost_called_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status last_store_error_ ABSL_GUARDED_BY(mu_);
  std::vector<Peer> peers_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace switchyard::comm

#endif  // SWITCHYARD_WORKER_COMM_PEER_MONITOR_H_
