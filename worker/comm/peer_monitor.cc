// File: worker/comm/peer_monitor.cc
#include "worker/comm/peer_monitor.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/status.h"

namespace switchyard::comm {
namespace {

constexpr char kAlive[] = "alive";
constexpr char kExited[] = "exited";

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "unknown-host";
  std::string name(buf);
  // The value is space-separated; a host name has no spaces, but never trust that.
  std::replace(name.begin(), name.end(), ' ', '_');
  return name;
}

// Codes a transport returns when a peer may have died (communicator.h's conventions, plus what
// Gloo and NCCL report for an unexpected failure).
bool IsCommunicationCode(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
      return true;
    default:
      return false;
  }
}

std::string Seconds(absl::Duration d) {
  return absl::StrFormat("%.1f s", absl::ToDoubleSeconds(d));
}

}  // namespace

absl::StatusOr<std::unique_ptr<PeerMonitor>> PeerMonitor::Create(std::shared_ptr<KvStore> store,
                                                                 int rank, int world,
                                                                 PeerMonitorOptions options) {
  if (store == nullptr) return absl::InvalidArgumentError("PeerMonitor: store must not be null");
  if (world < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("PeerMonitor: world (", world, ") must be >= 1"));
  }
  if (rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("PeerMonitor: rank (", rank, ") must be in [0, world ", world, ")"));
  }
  if (options.prefix.empty()) {
    return absl::InvalidArgumentError("PeerMonitorOptions.prefix must not be empty");
  }
  if (options.interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PeerMonitorOptions.interval (", absl::FormatDuration(options.interval), ") must be > 0"));
  }
  if (options.grace == absl::ZeroDuration()) options.grace = 3 * options.interval;
  if (options.grace < 2 * options.interval) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PeerMonitorOptions.grace (", absl::FormatDuration(options.grace),
        ") must be at least 2 x interval (", absl::FormatDuration(options.interval), ")"));
  }
  if (options.startup_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("PeerMonitorOptions.startup_timeout (",
                                                   absl::FormatDuration(options.startup_timeout),
                                                   ") must be >= 0"));
  }

  std::vector<int> watched;
  for (size_t i = 0; i < options.watch.size(); ++i) {
    const int r = options.watch[i];
    if (r < 0 || r >= world) {
      return absl::InvalidArgumentError(absl::StrCat("PeerMonitorOptions.watch[", i, "] (", r,
                                                     ") must be in [0, world ", world, ")"));
    }
    if (r != rank) watched.push_back(r);
  }
  if (options.watch.empty()) {
    for (int r = 0; r < world; ++r) {
      if (r != rank) watched.push_back(r);
    }
  }
  std::sort(watched.begin(), watched.end());
  watched.erase(std::unique(watched.begin(), watched.end()), watched.end());

  const absl::Time deadline = absl::Now() + options.startup_timeout;
  std::unique_ptr<PeerMonitor> m(
      new PeerMonitor(std::move(store), rank, world, std::move(options), std::move(watched)));
  {
    absl::MutexLock lock(&m->mu_);
    absl::Status s = m->Publish(/*exited=*/false);
    if (!s.ok()) return Annotate(s, absl::StrCat("PeerMonitor rank ", rank, ": first heartbeat"));
  }
  // The thread publishes from now on (peers that finish their own wait first must see this rank
  // advance); it judges nobody until every peer has shown up.
  m->thread_ = std::thread([p = m.get()] { p->Loop(); });

  std::vector<int> missing;
  absl::Status first_error;
  for (int r : m->watched_) {
    absl::StatusOr<std::string> v =
        m->store_->Get(m->Key(r), std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (v.ok()) continue;
    missing.push_back(r);
    if (!absl::IsDeadlineExceeded(v.status()) && first_error.ok()) first_error = v.status();
  }
  if (!missing.empty()) {
    m->Stop();
    if (!first_error.ok()) return Annotate(first_error, "PeerMonitor: reading peer heartbeats");
    return absl::DeadlineExceededError(absl::StrCat(
        "PeerMonitor rank ", rank, "/", world, ": rank(s) ", absl::StrJoin(missing, ", "),
        " published no heartbeat under '", m->options_.prefix, "/heartbeat/' within ",
        absl::FormatDuration(m->options_.startup_timeout), " (", m->store_->Describe(), ")"));
  }
  {
    absl::MutexLock lock(&m->mu_);
    m->Poll();
    // Every peer was just seen: silence is counted from here.
    const Clock::time_point now = Clock::now();
    for (Peer& p : m->peers_) p.last_change = now;
    m->ready_ = true;
  }
  return m;
}

PeerMonitor::PeerMonitor(std::shared_ptr<KvStore> store, int rank, int world,
                         PeerMonitorOptions options, std::vector<int> watched)
    : store_(std::move(store)),
      rank_(rank),
      world_(world),
      options_(std::move(options)),
      watched_(std::move(watched)),
      pid_(static_cast<int64_t>(getpid())),
      hostname_(HostName()),
      peers_(world) {
  const Clock::time_point now = Clock::now();
  for (Peer& p : peers_) p.last_change = now;
}

PeerMonitor::~PeerMonitor() { Stop(); }

std::string PeerMonitor::Key(int rank) const {
  return absl::StrCat(options_.prefix, "/heartbeat/", rank);
}

std::string PeerMonitor::Value(bool exited) const {
  return absl::StrCat(counter_, " ", pid_, " ", hostname_, " ", exited ? kExited : kAlive);
}

absl::Status PeerMonitor::Publish(bool exited) {
  ++counter_;
  return store_->Set(Key(rank_), Value(exited));
}

void PeerMonitor::Poll() {
  const Clock::time_point now = Clock::now();
  for (int r : watched_) {
    absl::StatusOr<bool> present = store_->Check(Key(r));
    if (!present.ok()) {
      last_store_error_ = present.status();
      continue;
    }
    if (!*present) continue;  // never published (or removed): not advancing
    // Present now, so a zero-timeout Get reads it once without waiting.
    absl::StatusOr<std::string> value = store_->Get(Key(r), absl::ZeroDuration());
    if (!value.ok()) {
      last_store_error_ = value.status();
      continue;
    }
    Peer& p = peers_[r];
    if (*value == p.value) continue;
    const std::vector<std::string> f = absl::StrSplit(*value, ' ');
    int64_t counter = 0, pid = 0;
    if (f.size() != 4 || !absl::SimpleAtoi(f[0], &counter) || !absl::SimpleAtoi(f[1], &pid) ||
        (f[3] != kAlive && f[3] != kExited)) {
      last_store_error_ = absl::DataLossError(
          absl::StrCat("heartbeat of rank ", r, " is malformed: '", *value, "'"));
      continue;
    }
    p.value = *value;
    p.counter = counter;
    p.pid = pid;
    p.hostname = f[2];
    p.exited = f[3] == kExited;
    p.last_change = now;
  }
}

std::vector<LostPeer> PeerMonitor::Lost(Clock::time_point now) const {
  std::vector<LostPeer> lost;
  if (!ready_) return lost;
  for (int r : watched_) {
    const Peer& p = peers_[r];
    if (p.exited) continue;
    const absl::Duration silent = absl::FromChrono(now - p.last_change);
    if (silent < options_.grace) continue;
    lost.push_back(LostPeer{r, p.pid, p.hostname, silent});
  }
  return lost;
}

std::string PeerMonitor::Verdict(const std::vector<LostPeer>& lost) const {
  std::vector<std::string> who;
  absl::Duration shortest = absl::InfiniteDuration();
  for (const LostPeer& p : lost) {
    who.push_back(p.pid >= 0 ? absl::StrCat(p.rank, " [pid ", p.pid, " on ", p.hostname, "]")
                             : absl::StrCat(p.rank));
    shortest = std::min(shortest, p.silent_for);
  }
  return absl::StrCat("lost rank(s): ", absl::StrJoin(who, ", "), ": no heartbeat for ",
                      Seconds(shortest));
}

std::vector<LostPeer> PeerMonitor::LostPeers() {
  absl::MutexLock lock(&mu_);
  Poll();
  return Lost(Clock::now());
}

std::vector<int> PeerMonitor::LostRanks() {
  std::vector<int> ranks;
  for (const LostPeer& p : LostPeers()) ranks.push_back(p.rank);
  return ranks;
}

absl::Status PeerMonitor::AnnotateFailure(const absl::Status& status) {
  if (status.ok()) return status;
  const absl::Duration wait = IsCommunicationCode(status.code())
                                  ? options_.grace + 2 * options_.interval
                                  : absl::ZeroDuration();
  const Clock::time_point deadline = Clock::now() + absl::ToChronoNanoseconds(wait);
  const absl::Duration poll = std::max(options_.interval / 5, absl::Milliseconds(1));
  while (true) {
    std::vector<LostPeer> lost;
    absl::Status store_error;
    {
      absl::MutexLock lock(&mu_);
      Poll();
      lost = Lost(Clock::now());
      store_error = last_store_error_;
    }
    if (!lost.empty()) {
      std::string msg = absl::StrCat(status.message(), " (", Verdict(lost));
      if (!store_error.ok()) {
        absl::StrAppend(&msg, "; heartbeat store error: ", store_error.message());
      }
      msg += ")";
      return absl::UnavailableError(msg);
    }
    const Clock::time_point now = Clock::now();
    if (now >= deadline) return status;
    absl::SleepFor(std::min(poll, absl::FromChrono(deadline - now)));
  }
}

void PeerMonitor::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      mu_.Await(absl::Condition(&stopped_));
      return;
    }
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  absl::MutexLock lock(&mu_);
  // Best effort: a rank that cannot say goodbye is reported lost by its peers after `grace`,
  // which is the truth as far as they can tell.
  (void)Publish(/*exited=*/true);
  stopped_ = true;
}

void PeerMonitor::Loop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    absl::Status s = Publish(/*exited=*/false);
    if (!s.ok()) last_store_error_ = s;
    if (ready_) {
      Poll();
      if (options_.on_lost && !on_lost_called_) {
        const std::vector<LostPeer> lost = Lost(Clock::now());
        if (!lost.empty()) {
          on_lost_called_ = true;
          const std::string verdict = Verdict(lost);
          mu_.Unlock();
          options_.on_lost(verdict);
          mu_.Lock();
          continue;  // stopping_ may have changed; the next beat is due now anyway
        }
      }
    }
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.interval);
  }
}

}  // namespace switchyard::comm
