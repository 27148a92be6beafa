// File: common/http_test_util.cc
#include "common/http_test_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace switchyard::testing {

int ConnectFrom(const std::string& source_ip, int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in src = {};
  src.sin_family = AF_INET;
  inet_pton(AF_INET, source_ip.c_str(), &src.sin_addr);
  sockaddr_in dst = {};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof(src)) != 0 ||
      connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof(dst)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

namespace {

// Appends what arrives within the time left; false at EOF, error or deadline.
bool ReadMore(int fd, absl::Time deadline, std::string* buf) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return false;
  pollfd p = {fd, POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1) <= 0) return false;
  char chunk[16 << 10];
  const ssize_t n = recv(fd, chunk, sizeof(chunk), 0);
  if (n <= 0) return false;
  buf->append(chunk, static_cast<size_t>(n));
  return true;
}

}  // namespace

RawResponse ReadResponse(int fd, absl::Duration timeout, std::string* pending) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string local;
  std::string& buf = pending != nullptr ? *pending : local;
  RawResponse out;
  size_t header_end;
  while ((header_end = buf.find("\r\n\r\n")) == std::string::npos) {
    if (!ReadMore(fd, deadline, &buf)) return out;
  }
  std::vector<std::string> lines = absl::StrSplit(buf.substr(0, header_end), "\r\n");
  std::vector<std::string> status_line = absl::StrSplit(lines[0], ' ');
  int status = 0;
  if (status_line.size() < 2 || !absl::SimpleAtoi(status_line[1], &status)) return out;
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == std::string::npos) continue;
    out.headers[absl::AsciiStrToLower(lines[i].substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
  }
  size_t length = 0;
  if (auto it = out.headers.find("content-length"); it != out.headers.end()) {
    if (!absl::SimpleAtoi(it->second, &length)) return out;
  }
  while (buf.size() < header_end + 4 + length) {
    if (!ReadMore(fd, deadline, &buf)) return out;
  }
  out.body = buf.substr(header_end + 4, length);
  buf.erase(0, header_end + 4 + length);
  out.status = status;
  return out;
}

bool WaitClosed(int fd, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1) <= 0) return false;
    char chunk[4096];
    const ssize_t n = recv(fd, chunk, sizeof(chunk), 0);
    if (n <= 0) return true;
  }
}

SlowClients::SlowClients(int port, int count, int first_host, int hosts, const std::string& payload,
                         absl::Duration interval)
    : payload_(payload), interval_(interval) {
  for (int i = 0; i < count; ++i) {
    const int fd = ConnectFrom(absl::StrCat("127.0.0.", first_host + i % hosts), port);
    fds_.push_back(fd);
    connected_ += fd >= 0;
  }
  feeder_ = std::thread([this] {
    std::vector<bool> gone(fds_.size(), false);
    for (size_t next = 0; !stop_.load(); ++next) {
      for (size_t i = 0; i < fds_.size(); ++i) {
        if (fds_[i] < 0 || gone[i]) continue;
        const char c = payload_[next % payload_.size()];
        if (send(fds_[i], &c, 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno != EAGAIN) {
          gone[i] = true;
          closed_.fetch_add(1);
          continue;
        }
        // A server that closed the connection shows as EOF before the send fails.
        char peek;
        if (recv(fds_[i], &peek, 1, MSG_PEEK | MSG_DONTWAIT) == 0) {
          gone[i] = true;
          closed_.fetch_add(1);
        }
      }
      const absl::Time wake = absl::Now() + interval_;
      while (!stop_.load() && absl::Now() < wake) absl::SleepFor(absl::Milliseconds(5));
    }
  });
}

SlowClients::~SlowClients() { Stop(); }

void SlowClients::Stop() {
  stop_.store(true);
  if (feeder_.joinable()) feeder_.join();
  for (int& fd : fds_) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
}

}  // namespace switchyard::testing
