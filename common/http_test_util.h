// File: common/http_test_util.h
//
// Raw-socket HTTP clients for tests on loopback: connections from a chosen source address
// (127.0.0.2, 127.0.0.3, ... are all loopback on Linux, so a per-client cap can tell test clients
// apart), one-response reads with a bound, and SlowClients, a slowloris attack that keeps N
// connections each sending a partial request one byte at a time.
#ifndef SWITCHYARD_COMMON_HTTP_TEST_UTIL_H_
#define SWITCHYARD_COMMON_HTTP_TEST_UTIL_H_

#include <atomic>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"

namespace switchyard::testing {

// A TCP connection from `source_ip` (port chosen by the kernel) to 127.0.0.1:`port`; -1 on error.
int ConnectFrom(const std::string& source_ip, int port);
bool SendAll(int fd, const std::string& data);

struct RawResponse {
  int status = 0;                              // 0: no complete response arrived
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
};
// Reads one response (Content-Length framed) from `fd`, waiting at most `timeout` in all.
// `pending` keeps bytes read past it (pipelined responses); pass the same string again.
RawResponse ReadResponse(int fd, absl::Duration timeout, std::string* pending = nullptr);
// True when the peer closes `fd` (EOF or reset) within `timeout`; discards what it reads.
bool WaitClosed(int fd, absl::Duration timeout);

// `count` connections to 127.0.0.1:`port` from sources 127.0.0.`first_host`, `first_host`+1, ...
// (`hosts` of them, round robin); each gets one byte of `payload` every `interval` from a feeder
// thread, and never the whole of it while the attack lasts (the payload must be longer than the
// attack's duration / interval). Connections the server closes are counted, not reopened.
class SlowClients {
 public:
  SlowClients(int port, int count, int first_host, int hosts, const std::string& payload,
              absl::Duration interval);
  ~SlowClients();  // Stop()s.
  // Connections that connected.
  int connected() const { return connected_; }
  // Connections the server has closed so far.
  int closed() const { return closed_.load(); }
  void Stop();

 private:
  std::vector<int> fds_;
  std::string payload_;
  absl::Duration interval_;
  int connected_ = 0;
  std::atomic<int> closed_{0};
  std::atomic<bool> stop_{false};
  std::thread feeder_;
};

}  // namespace switchyard::testing

#endif  // SWITCHYARD_COMMON_HTTP_TEST_UTIL_H_
