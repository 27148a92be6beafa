// File: common/port_test_util.cc
#include "common/port_test_util.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <random>

namespace switchyard::testing {

int FreePort() {
  // The ephemeral range's lower bound (Linux default 32768); ports are drawn from [10000, low).
  int low = 32768;
  {
    std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
    int lo = 0, hi = 0;
    if (range >> lo >> hi && lo > 10000 + 1000) low = lo;
  }
  std::random_device seed;
  std::mt19937 rng(seed() ^ static_cast<unsigned>(getpid()));
  std::uniform_int_distribution<int> pick(10000, low - 1);
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port = pick(rng);
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    if (ok) return port;
  }
  return 0;
}

}  // namespace switchyard::testing
