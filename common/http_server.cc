// File: common/http_server.cc
#include "common/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace switchyard {
namespace {

// How often the watchdog looks at the deadlines: the resolution of every timeout.
constexpr absl::Duration kWatchdogTick = absl::Milliseconds(20);
// After an error response the server reads and discards what the client still sends for at most
// this long (and at most request_timeout) and this many bytes before it closes.
constexpr absl::Duration kLingerTimeout = absl::Seconds(2);
constexpr size_t kLingerBytes = 64 << 20;
// How often the accept loop wakes to join finished connection threads when idle.
constexpr int kReapIntervalMs = 500;

const char* Reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 411:
      return "Length Required";
    case 413:
      return "Payload Too Large";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 499:
      return "Client Closed Request";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      return "Unknown";
  }
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// %XX-decodes `s` (and '+' as a space when `plus_is_space`); a malformed escape stays as is.
std::string PercentDecode(absl::string_view s, bool plus_is_space) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      const int hi = HexValue(s[i + 1]), lo = HexValue(s[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out.push_back(static_cast<char>(hi * 16 + lo));
        i += 2;
        continue;
      }
    }
    out.push_back(plus_is_space && s[i] == '+' ? ' ' : s[i]);
  }
  return out;
}

std::string PeerAddress(const sockaddr_storage& addr) {
  char text[INET6_ADDRSTRLEN] = {0};
  if (addr.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(addr).sin_addr, text, sizeof(text));
  } else if (addr.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(addr).sin6_addr, text, sizeof(text));
  }
  return text;
}

std::string OpenSslErrors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "unknown error" : out;
}

std::string SerializeResponse(const HttpResponse& res, bool keep_alive) {
  std::string out = absl::StrCat("HTTP/1.1 ", res.status, " ", Reason(res.status), "\r\n");
  absl::StrAppend(&out, "Content-Type: ", res.content_type, "\r\n");
  absl::StrAppend(&out, "Content-Length: ", res.body.size(), "\r\n");
  absl::StrAppend(&out, "Connection: ", keep_alive ? "keep-alive" : "close", "\r\n");
  for (const auto& [name, value] : res.headers) absl::StrAppend(&out, name, ": ", value, "\r\n");
  out += "\r\n";
  out += res.body;
  return out;
}

}  // namespace

std::string HttpRequest::Header(const std::string& name) const {
  auto it = headers.find(absl::AsciiStrToLower(name));
  return it == headers.end() ? "" : it->second;
}

// ---------------------------------------------------------------------------------------------
// HttpRouter

void HttpRouter::Handle(const std::string& method, const std::string& path, Handler handler) {
  Route r;
  r.method = method;
  r.path = path;
  r.handler = std::move(handler);
  routes_.push_back(std::move(r));
}

void HttpRouter::HandleRegex(const std::string& method, const std::string& pattern,
                             Handler handler) {
  Route r;
  r.method = method;
  r.is_regex = true;
  r.pattern = std::regex(pattern, std::regex::ECMAScript);
  r.handler = std::move(handler);
  routes_.push_back(std::move(r));
}

void HttpRouter::RenderError(const HttpRequest& request, int status, const std::string& message,
                             HttpResponse* response) const {
  response->status = status;
  response->body.clear();
  if (error_renderer_) {
    error_renderer_(request, message, response);
  } else {
    response->content_type = "text/plain";
    response->body = message + "\n";
  }
  response->status = status;
}

void HttpRouter::Dispatch(HttpRequest& request, HttpResponse* response) const {
  std::vector<std::string> allowed;
  for (const Route& route : routes_) {
    std::smatch match;
    bool matched = false;
    if (route.is_regex) {
      matched = std::regex_match(request.path, match, route.pattern);
    } else {
      matched = request.path == route.path;
    }
    if (!matched) continue;
    if (route.method != request.method) {
      if (std::find(allowed.begin(), allowed.end(), route.method) == allowed.end()) {
        allowed.push_back(route.method);
      }
      continue;
    }
    request.matches.clear();
    if (route.is_regex) {
      for (const auto& m : match) request.matches.push_back(m.str());
    } else {
      request.matches.push_back(request.path);
    }
    route.handler(request, response);
    return;
  }
  if (!allowed.empty()) {
    const std::string allow = absl::StrJoin(allowed, ", ");
    RenderError(request, 405,
                absl::StrCat("method ", request.method, " is not allowed on ", request.path,
                             " (allowed: ", allow, ")"),
                response);
    response->headers.emplace_back("Allow", allow);
    return;
  }
  RenderError(request, 404, absl::StrCat("no route for ", request.method, " ", request.path),
              response);
}

// ---------------------------------------------------------------------------------------------
// Stream: a connected socket, plain or TLS. Blocking I/O; the watchdog unblocks it by shutting
// the socket down.

class HttpServer::Stream {
 public:
  explicit Stream(int fd) : fd_(fd) {}
  ~Stream() {
    if (ssl_ != nullptr) SSL_free(ssl_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // The server side of a TLS handshake; false when it fails (or the watchdog ended it).
  bool Handshake(SSL_CTX* ctx) {
    ssl_ = SSL_new(ctx);
    if (ssl_ == nullptr || SSL_set_fd(ssl_, fd_) != 1) return false;
    if (SSL_accept(ssl_) != 1) {
      ERR_clear_error();
      return false;
    }
    return true;
  }

  // > 0: bytes read; 0: end of stream; < 0: error.
  long Read(char* buf, size_t n) {
    if (ssl_ != nullptr) {
      const int r = SSL_read(ssl_, buf, static_cast<int>(std::min<size_t>(n, 1 << 30)));
      if (r <= 0) ERR_clear_error();
      return r;
    }
    for (;;) {
      const ssize_t r = recv(fd_, buf, n, 0);
      if (r < 0 && errno == EINTR) continue;
      return static_cast<long>(r);
    }
  }

  bool Write(const std::string& data) {
    size_t done = 0;
    while (done < data.size()) {
      if (ssl_ != nullptr) {
        const int w = SSL_write(ssl_, data.data() + done,
                                static_cast<int>(std::min<size_t>(data.size() - done, 1 << 30)));
        if (w <= 0) {
          ERR_clear_error();
          return false;
        }
        done += static_cast<size_t>(w);
      } else {
        const ssize_t w = send(fd_, data.data() + done, data.size() - done, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        done += static_cast<size_t>(w);
      }
    }
    return true;
  }

 private:
  int fd_;
  SSL* ssl_ = nullptr;
};

// ---------------------------------------------------------------------------------------------
// HttpServer

HttpServer::HttpServer(HttpServerOptions options, HttpRouter router)
    : options_(std::move(options)), router_(std::move(router)) {}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Create(const std::string& host, int port,
                                                               HttpServerOptions options,
                                                               HttpRouter router) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("http port: ", port, " is not in [0, 65535]"));
  }
  if (options.max_connections < 1 || options.max_connections_per_client < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_connections (", options.max_connections, ") and max_connections_per_client (",
        options.max_connections_per_client, ") must be >= 1"));
  }
  for (const auto& [name, d] :
       {std::pair<const char*, absl::Duration>{"request_timeout", options.request_timeout},
        {"idle_timeout", options.idle_timeout},
        {"send_timeout", options.send_timeout}}) {
    if (d <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " (", absl::FormatDuration(d), ") must be > 0"));
    }
  }
  if (options.max_header_bytes < 64 || options.max_body_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_header_bytes (", options.max_header_bytes,
                                                   ") must be >= 64 and max_body_bytes (",
                                                   options.max_body_bytes, ") >= 1"));
  }
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "tls-cert, tls-key: give both (HTTPS) or neither (plain HTTP)");
  }
  std::unique_ptr<HttpServer> server(new HttpServer(std::move(options), std::move(router)));
  const HttpServerOptions& o = server->options_;
  if (!o.tls_cert_file.empty()) {
    server->ssl_ctx_ = SSL_CTX_new(TLS_server_method());
    if (server->ssl_ctx_ == nullptr) {
      return absl::InternalError(absl::StrCat("OpenSSL: SSL_CTX_new: ", OpenSslErrors()));
    }
    SSL_CTX_set_min_proto_version(server->ssl_ctx_, TLS1_2_VERSION);
    if (SSL_CTX_use_certificate_chain_file(server->ssl_ctx_, o.tls_cert_file.c_str()) != 1 ||
        SSL_CTX_use_PrivateKey_file(server->ssl_ctx_, o.tls_key_file.c_str(), SSL_FILETYPE_PEM) !=
            1 ||
        SSL_CTX_check_private_key(server->ssl_ctx_) != 1) {
      return absl::InvalidArgumentError(absl::StrCat("tls-cert, tls-key: OpenSSL cannot load ",
                                                     o.tls_cert_file, " and ", o.tls_key_file, ": ",
                                                     OpenSslErrors()));
    }
  }

  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found);
      rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("http: cannot resolve ", host, ": ", gai_strerror(rc)));
  }
  int last_errno = 0;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last_errno = errno;
      continue;
    }
    // SO_REUSEADDR only (fast restarts); never SO_REUSEPORT, which would let a second process
    // bind the same port and take part of the traffic.
    int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 128) == 0) {
      server->listen_fd_ = fd;
      break;
    }
    last_errno = errno;
    close(fd);
  }
  freeaddrinfo(found);
  if (server->listen_fd_ < 0) {
    return absl::UnavailableError(
        absl::StrCat("http: cannot bind ", host, ":", port, ": ", std::strerror(last_errno)));
  }
  sockaddr_storage bound = {};
  socklen_t bound_len = sizeof(bound);
  getsockname(server->listen_fd_, reinterpret_cast<sockaddr*>(&bound), &bound_len);
  server->bound_address_ = PeerAddress(bound);
  server->port_ =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6&>(bound).sin6_port
                                        : reinterpret_cast<sockaddr_in&>(bound).sin_port);
  if (pipe2(server->wake_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat("http: pipe: ", std::strerror(errno)));
  }
  HttpServer* s = server.get();
  server->watchdog_thread_ = std::thread([s] { s->WatchdogLoop(); });
  server->accept_thread_ = std::thread([s] { s->AcceptLoop(); });
  return server;
}

HttpServer::~HttpServer() {
  Stop();
  if (listen_fd_ >= 0) close(listen_fd_);
  for (int fd : wake_pipe_) {
    if (fd >= 0) close(fd);
  }
  if (ssl_ctx_ != nullptr) SSL_CTX_free(ssl_ctx_);
}

int HttpServer::open_connections() const {
  absl::MutexLock lock(&mu_);
  return open_;
}

void HttpServer::Stop() {
  if (stopped_) return;
  stopped_ = true;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (wake_pipe_[1] >= 0) {
    const char c = 0;
    (void)!write(wake_pipe_[1], &c, 1);
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    // Reading or idle connections end now; a handler in flight finishes and writes its response
    // (SetPhase ends the connection when it next reads).
    for (auto& [id, conn] : connections_) {
      if (conn->fd >= 0 && conn->phase == Phase::kReading) shutdown(conn->fd, SHUT_RD);
      if (conn->thread.joinable()) threads.push_back(std::move(conn->thread));
    }
  }
  for (std::thread& t : threads) t.join();
  {
    absl::MutexLock lock(&mu_);
    connections_.clear();
    finished_.clear();
    watchdog_exit_ = true;
  }
  if (watchdog_thread_.joinable()) watchdog_thread_.join();
}

void HttpServer::ReapFinished() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    for (uint64_t id : finished_) {
      auto it = connections_.find(id);
      if (it == connections_.end()) continue;
      if (it->second->thread.joinable()) threads.push_back(std::move(it->second->thread));
      connections_.erase(it);
    }
    finished_.clear();
  }
  for (std::thread& t : threads) t.join();
}

void HttpServer::Refuse(int fd, const std::string& why) {
  if (ssl_ctx_ == nullptr) {
    HttpRequest request;
    HttpResponse response;
    router_.RenderError(request, 503, why, &response);
    response.headers.emplace_back("Retry-After", "1");
    const std::string out = SerializeResponse(response, /*keep_alive=*/false);
    // Never blocks: the response fits the socket's fresh send buffer or is cut.
    (void)!send(fd, out.data(), out.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    shutdown(fd, SHUT_WR);
    char drain[1024];
    while (recv(fd, drain, sizeof(drain), MSG_DONTWAIT) > 0) {
    }
  }
  close(fd);
}

void HttpServer::AcceptLoop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_pipe_[0], POLLIN, 0}};
    const int ready = poll(fds, 2, kReapIntervalMs);
    ReapFinished();
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    if (ready <= 0 || (fds[0].revents & POLLIN) == 0) continue;
    sockaddr_storage addr = {};
    socklen_t len = sizeof(addr);
    const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_CLOEXEC);
    if (fd < 0) {
      // EMFILE and the like: back off instead of spinning on a ready listen socket.
      if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    const std::string client = PeerAddress(addr);
    std::string refused;
    Connection* conn = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (open_ >= options_.max_connections) {
        refused = absl::StrCat("the server holds its maximum of ", options_.max_connections,
                               " connections; retry later");
      } else if (per_client_[client] >= options_.max_connections_per_client) {
        refused =
            absl::StrCat("client ", client, " already holds ", options_.max_connections_per_client,
                         " connections (the per-client maximum); retry later");
      } else {
        auto owned = std::make_unique<Connection>();
        conn = owned.get();
        conn->id = next_id_++;
        conn->fd = fd;
        conn->client = client;
        // The first request, TLS handshake included, counts from accept.
        conn->deadline = absl::Now() + options_.request_timeout;
        ++open_;
        ++per_client_[client];
        connections_.emplace(conn->id, std::move(owned));
      }
      if (per_client_[client] == 0) per_client_.erase(client);
    }
    if (conn == nullptr) {
      Refuse(fd, refused);
      continue;
    }
    try {
      conn->thread = std::thread([this, conn] { Serve(conn); });
    } catch (const std::system_error&) {
      absl::MutexLock lock(&mu_);
      close(conn->fd);
      --open_;
      if (--per_client_[conn->client] == 0) per_client_.erase(conn->client);
      connections_.erase(conn->id);
    }
  }
}

void HttpServer::WatchdogLoop() {
  absl::MutexLock lock(&mu_);
  // Runs until Stop has joined the accept thread and every connection thread.
  while (!watchdog_exit_) {
    const absl::Time now = absl::Now();
    for (auto& [id, conn] : connections_) {
      if (conn->fd < 0 || conn->timed_out || now < conn->deadline) continue;
      conn->timed_out = true;
      // A reader may still get a 408 out; a writer that cannot write is cut off.
      shutdown(conn->fd, conn->phase == Phase::kReading ? SHUT_RD : SHUT_RDWR);
    }
    mu_.AwaitWithTimeout(absl::Condition(&watchdog_exit_), kWatchdogTick);
  }
}

void HttpServer::SetPhase(Connection* conn, Phase phase, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  conn->phase = phase;
  conn->deadline = deadline;
  conn->timed_out = false;
  // Stop may have passed this connection while its handler ran: end the read now.
  if (stopping_ && phase == Phase::kReading && conn->fd >= 0) shutdown(conn->fd, SHUT_RD);
}

bool HttpServer::TimedOut(Connection* conn) {
  absl::MutexLock lock(&mu_);
  return conn->timed_out;
}

void HttpServer::Serve(Connection* conn) {
  // Writes to a peer that has gone must fail with EPIPE, not kill the process (OpenSSL writes
  // with write(2), which has no MSG_NOSIGNAL).
  sigset_t pipe_only;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_only, nullptr);
  {
    Stream stream(conn->fd);
    if (ssl_ctx_ == nullptr || stream.Handshake(ssl_ctx_)) ServeRequests(conn, stream);
  }
  absl::MutexLock lock(&mu_);
  close(conn->fd);
  conn->fd = -1;
  --open_;
  if (--per_client_[conn->client] == 0) per_client_.erase(conn->client);
  conn->done = true;
  finished_.push_back(conn->id);
}

void HttpServer::ServeRequests(Connection* conn, Stream& stream) {
  const HttpServerOptions& o = options_;
  std::string buf;
  bool first = true;
  char chunk[16 << 10];
  // Answers an error the server found itself and ends the connection.
  auto fail = [&](const HttpRequest& request, int status, const std::string& message) {
    HttpResponse response;
    router_.RenderError(request, status, message, &response);
    SetPhase(conn, Phase::kWriting, absl::Now() + o.send_timeout);
    if (!stream.Write(SerializeResponse(response, /*keep_alive=*/false))) return;
    // Lingering close: the client may still be sending (a refused 8 MiB body); closing now would
    // answer its data with a reset that can destroy the response before it is read. Discard what
    // arrives for a bounded time and amount, then close.
    if (ssl_ctx_ == nullptr) shutdown(conn->fd, SHUT_WR);
    SetPhase(conn, Phase::kReading, absl::Now() + std::min(o.request_timeout, kLingerTimeout));
    size_t discarded = 0;
    while (discarded < kLingerBytes) {
      const long n = stream.Read(chunk, sizeof(chunk));
      if (n <= 0) break;
      discarded += static_cast<size_t>(n);
    }
  };
  const std::string timeout_message =
      absl::StrCat("request not complete within ", absl::FormatDuration(o.request_timeout),
                   " (request_timeout)");
  for (;;) {
    HttpRequest request;
    request.client_address = conn->client;
    // Wait for the request's first byte (a later request of a keep-alive connection: under the
    // idle timeout), then the whole request under request_timeout.
    bool started = first || !buf.empty();
    if (!first) {
      SetPhase(conn, Phase::kReading, absl::Now() + (started ? o.request_timeout : o.idle_timeout));
    }
    size_t header_end;
    while ((header_end = buf.find("\r\n\r\n")) == std::string::npos) {
      if (buf.size() > o.max_header_bytes) {
        return fail(request, 431,
                    absl::StrCat("request line and headers: larger than ", o.max_header_bytes,
                                 " bytes (max_header_bytes)"));
      }
      const long n = stream.Read(chunk, sizeof(chunk));
      if (n <= 0) {
        if (started && TimedOut(conn)) fail(request, 408, timeout_message);
        return;
      }
      if (!started) {
        started = true;
        SetPhase(conn, Phase::kReading, absl::Now() + o.request_timeout);
      }
      buf.append(chunk, static_cast<size_t>(n));
    }
    if (header_end + 4 > o.max_header_bytes) {
      return fail(request, 431,
                  absl::StrCat("request line and headers: larger than ", o.max_header_bytes,
                               " bytes (max_header_bytes)"));
    }
    std::vector<absl::string_view> lines =
        absl::StrSplit(absl::string_view(buf).substr(0, header_end), "\r\n");
    std::vector<absl::string_view> request_line = absl::StrSplit(lines[0], ' ');
    if (request_line.size() != 3 || request_line[0].empty() || request_line[1].empty() ||
        !absl::StartsWith(request_line[2], "HTTP/1.")) {
      return fail(request, 400,
                  absl::StrCat("request line: expected \"METHOD /path HTTP/1.1\", got \"",
                               lines[0].substr(0, 80), "\""));
    }
    request.method = std::string(request_line[0]);
    request.target = std::string(request_line[1]);
    const bool http10 = request_line[2] == "HTTP/1.0";
    for (size_t i = 1; i < lines.size(); ++i) {
      const size_t colon = lines[i].find(':');
      if (colon == absl::string_view::npos || colon == 0 || lines[i][0] == ' ' ||
          lines[i][0] == '\t' || lines[i].substr(0, colon).find(' ') != absl::string_view::npos) {
        return fail(request, 400,
                    absl::StrCat("header line ", i, ": expected \"Name: value\", got \"",
                                 lines[i].substr(0, 80), "\""));
      }
      std::string name = absl::AsciiStrToLower(lines[i].substr(0, colon));
      std::string value(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
      auto [it, inserted] = request.headers.emplace(name, value);
      if (!inserted) {
        if (name == "content-length" && it->second != value) {
          return fail(request, 400, "Content-Length: given twice with different values");
        }
        if (name != "content-length") it->second = absl::StrCat(it->second, ", ", value);
      }
    }
    // Body framing (RFC 9112 6): Transfer-Encoding chunked, or Content-Length, or none.
    bool chunked = false;
    if (const std::string te = request.Header("Transfer-Encoding"); !te.empty()) {
      if (!absl::EqualsIgnoreCase(te, "chunked")) {
        return fail(request, 501,
                    absl::StrCat("Transfer-Encoding: \"", te.substr(0, 40),
                                 "\" is not supported; send the body chunked or with a "
                                 "Content-Length header"));
      }
      // Both framings at once is how requests are smuggled past proxies (RFC 9112 6.3 lets a
      // server reject it); HTTP/1.0 has no chunked coding.
      if (request.headers.count("content-length") != 0) {
        return fail(request, 400, "Transfer-Encoding and Content-Length: send only one of them");
      }
      if (http10) {
        return fail(request, 400, "Transfer-Encoding: not allowed in an HTTP/1.0 request");
      }
      chunked = true;
    }
    size_t body_length = 0;
    if (auto it = request.headers.find("content-length"); it != request.headers.end()) {
      const std::string& v = it->second;
      if (v.empty() || v.size() > 19 ||
          !std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        return fail(
            request, 400,
            absl::StrCat("Content-Length: \"", v.substr(0, 40), "\" is not a decimal byte count"));
      }
      uint64_t parsed = 0;
      if (!absl::SimpleAtoi(v, &parsed) || parsed > o.max_body_bytes) {
        return fail(request, 413,
                    absl::StrCat("request body: larger than ", o.max_body_bytes,
                                 " bytes (Content-Length ", v, ")"));
      }
      body_length = static_cast<size_t>(parsed);
    }
    // The headers are parsed (`lines` is not used again): drop them, the body starts at buf[0].
    buf.erase(0, header_end + 4);
    // Reads more of the request into buf under the request's deadline; false when the connection
    // ended (a 408 is sent first when the deadline passed).
    auto read_more = [&]() {
      const long n = stream.Read(chunk, sizeof(chunk));
      if (n <= 0) {
        if (TimedOut(conn)) fail(request, 408, timeout_message);
        return false;
      }
      buf.append(chunk, static_cast<size_t>(n));
      return true;
    };
    if (chunked) {
      // chunk = chunk-size [ chunk-ext ] CRLF chunk-data CRLF, ending with a zero-size chunk, then
      // trailer fields and an empty line (RFC 9112 7.1). Extensions are ignored, trailers read
      // and dropped; the decoded body is capped by max_body_bytes, size and trailer lines by
      // max_header_bytes.
      size_t pos = 0;
      for (;;) {
        size_t eol;
        while ((eol = buf.find("\r\n", pos)) == std::string::npos) {
          if (buf.size() - pos > o.max_header_bytes) {
            return fail(request, 400,
                        absl::StrCat("chunked body: a chunk-size line longer than ",
                                     o.max_header_bytes, " bytes (max_header_bytes)"));
          }
          if (!read_more()) return;
        }
        const absl::string_view line = absl::string_view(buf).substr(pos, eol - pos);
        const absl::string_view hex =
            absl::StripTrailingAsciiWhitespace(line.substr(0, line.find(';')));
        uint64_t size = 0;
        if (hex.empty() || hex.size() > 16 ||
            !std::all_of(hex.begin(), hex.end(), [](char c) { return absl::ascii_isxdigit(c); }) ||
            !absl::SimpleHexAtoi(hex, &size)) {
          return fail(request, 400,
                      absl::StrCat("chunked body: chunk size \"", line.substr(0, 40),
                                   "\" is not a hexadecimal byte count"));
        }
        if (size > o.max_body_bytes - request.body.size()) {
          return fail(
              request, 413,
              absl::StrCat("request body: larger than ", o.max_body_bytes, " bytes (chunked)"));
        }
        pos = eol + 2;
        if (size == 0) break;
        while (buf.size() < pos + size + 2) {
          if (!read_more()) return;
        }
        if (buf.compare(pos + size, 2, "\r\n") != 0) {
          return fail(request, 400,
                      absl::StrCat("chunked body: chunk data not followed by CRLF (chunk size ",
                                   size, ")"));
        }
        request.body.append(buf, pos, size);
        buf.erase(0, pos + size + 2);
        pos = 0;
      }
      // The trailer section: field lines until an empty line, dropped.
      const size_t trailer_start = pos;
      for (;;) {
        size_t eol;
        while ((eol = buf.find("\r\n", pos)) == std::string::npos) {
          if (buf.size() - trailer_start > o.max_header_bytes) {
            return fail(request, 431,
                        absl::StrCat("chunked body: trailer fields larger than ",
                                     o.max_header_bytes, " bytes (max_header_bytes)"));
          }
          if (!read_more()) return;
        }
        if (eol - trailer_start > o.max_header_bytes) {
          return fail(request, 431,
                      absl::StrCat("chunked body: trailer fields larger than ", o.max_header_bytes,
                                   " bytes (max_header_bytes)"));
        }
        const bool last = eol == pos;
        pos = eol + 2;
        if (last) break;
      }
      buf.erase(0, pos);
    } else {
      while (buf.size() < body_length) {
        if (!read_more()) return;
      }
      request.body = buf.substr(0, body_length);
      buf.erase(0, body_length);
    }

    const size_t question = request.target.find('?');
    request.path = PercentDecode(absl::string_view(request.target).substr(0, question), false);
    if (question != std::string::npos) {
      for (absl::string_view pair : absl::StrSplit(
               absl::string_view(request.target).substr(question + 1), '&', absl::SkipEmpty())) {
        const size_t eq = pair.find('=');
        request.params.emplace_back(PercentDecode(pair.substr(0, eq), true),
                                    eq == absl::string_view::npos
                                        ? std::string()
                                        : PercentDecode(pair.substr(eq + 1), true));
      }
    }
    const std::string connection = absl::AsciiStrToLower(request.Header("Connection"));
    bool keep_alive = http10 ? absl::StrContains(connection, "keep-alive")
                             : !absl::StrContains(connection, "close");

    SetPhase(conn, Phase::kHandling, absl::InfiniteFuture());
    HttpResponse response;
    router_.Dispatch(request, &response);
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) keep_alive = false;
    }
    SetPhase(conn, Phase::kWriting, absl::Now() + o.send_timeout);
    if (!stream.Write(SerializeResponse(response, keep_alive)) || !keep_alive) return;
    first = false;
  }
}

}  // namespace switchyard
