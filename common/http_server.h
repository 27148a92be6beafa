// File: common/http_server.h
//
// A small HTTP/1.1 server that a few slow or hostile clients cannot starve (issue 17): it serves
// the coordinator's REST gateway and the worker's /metrics. It replaces cpp-httplib's server,
// whose fixed thread pool let 8 connections that send a request one byte per second make every
// route, /healthz and /metrics time out, and which (Debian 12's 0.11) has no hook to bound the
// connections of one client or the *total* time of a request.
//
// Model: one accept thread, one thread per connection, one watchdog thread.
//   - Caps: at most `max_connections` open connections, at most `max_connections_per_client`
//     from one client IP address. A connection over a cap is answered at once with
//     503 Service Unavailable and closed (over HTTPS it is closed without a response: answering
//     would need a TLS handshake, which is what a slow client stalls).
//   - Deadlines, enforced by the watchdog, which shuts the socket down when one passes (so a
//     client that sends one byte per second cannot extend them):
//       request_timeout  the whole request: for the first request of a connection it counts from
//                        accept (TLS handshake included), for a later one from its first byte;
//                        covers the request line, headers and body. Expiry: 408 and close.
//       idle_timeout     a keep-alive connection waiting for its next request's first byte.
//       send_timeout     writing one response (a client that does not read).
//     The handler's own run time is not bounded (it is the server's work, not the client's).
//   - Bodies: Content-Length, or Transfer-Encoding: chunked (RFC 9112 7.1: hex chunk sizes,
//     chunk extensions ignored, trailer fields read and dropped; the handler sees the decoded
//     body), both under the same max_body_bytes and request_timeout.
//   - Limits: request line + headers over max_header_bytes -> 431; Content-Length over
//     max_body_bytes -> 413 (the body is not read); a chunked body whose chunks add up to more
//     than max_body_bytes -> 413 (before the chunk that crosses it is read); a chunk-size line
//     that is not hex or is longer than max_header_bytes, chunk data not followed by CRLF,
//     Transfer-Encoding together with Content-Length, or in an HTTP/1.0 request -> 400; trailer
//     fields over max_header_bytes -> 431; any Transfer-Encoding but "chunked" (e.g. "gzip,
//     chunked") -> 501; a malformed request -> 400. Each of
//     these closes the connection after the response, lingering first (what the client still
//     sends is read and dropped for up to 2 s / 64 MiB) so that it reads the response instead
//     of a reset.
//   - Keep-alive: HTTP/1.1 keeps the connection unless "Connection: close"; HTTP/1.0 closes it
//     unless "Connection: keep-alive". Pipelined requests are served in order.
//
// Routing (HttpRouter): exact paths or ECMAScript regexes over the whole (percent-decoded) path.
// A path that some route matches but not with this method is 405 with an `Allow` header listing
// the methods it has; a path no route matches is 404. The bodies of 404/405 and of the server's
// own errors (400, 408, 413, 431, 501, 503) come from the router's error renderer, so a
// JSON API keeps one error shape.
//
// Thread rules: Create and Stop from one owner thread. Handlers run on connection threads, many
// at once: they must be thread-safe and must not call Stop. The router is immutable once given to
// Create.
#ifndef SWITCHYARD_COMMON_HTTP_SERVER_H_
#define SWITCHYARD_COMMON_HTTP_SERVER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

typedef struct ssl_ctx_st SSL_CTX;

namespace switchyard {

struct HttpRequest {
  std::string method;  // "GET", "POST", ... (case as sent)
  std::string target;  // as sent: "/v1/jobs?state=RUNNING"
  std::string path;    // percent-decoded, without the query: "/v1/jobs"
  std::vector<std::pair<std::string, std::string>> params;  // decoded query, in order
  std::map<std::string, std::string> headers;               // names lower-cased
  std::string body;
  std::string client_address;        // peer IP address, e.g. "127.0.0.1"
  std::vector<std::string> matches;  // regex route: [0] the path, [1..] the groups

  // The value of header `name` (any case), "" when absent.
  std::string Header(const std::string& name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers
};

class HttpRouter {
 public:
  using Handler = std::function<void(const HttpRequest&, HttpResponse*)>;
  // Fills `response` (status already set) with a body for an error the router or server found.
  using ErrorRenderer =
      std::function<void(const HttpRequest&, const std::string& message, HttpResponse*)>;

  // Routes `method` on exactly `path`.
  void Handle(const std::string& method, const std::string& path, Handler handler);
  // Routes `method` on paths matching the whole of `pattern`; groups go to request.matches.
  void HandleRegex(const std::string& method, const std::string& pattern, Handler handler);
  // Default: a text/plain body holding the message.
  void SetErrorRenderer(ErrorRenderer renderer) { error_renderer_ = std::move(renderer); }

  // Runs the handler of the request's method and path, or answers 404 / 405 + Allow.
  void Dispatch(HttpRequest& request, HttpResponse* response) const;
  // An error response (status, message) through the error renderer.
  void RenderError(const HttpRequest& request, int status, const std::string& message,
                   HttpResponse* response) const;

 private:
  struct Route {
    std::string method;
    std::string path;  // exact, when !is_regex
    bool is_regex = false;
    std::regex pattern;
    Handler handler;
  };
  std::vector<Route> routes_;
  ErrorRenderer error_renderer_;
};

struct HttpServerOptions {
  // Open connections, all clients together; more are refused with 503.
  int max_connections = 512;
  // Open connections from one client IP address; more are refused with 503. Behind a proxy that
  // does not keep the client's address every client shares the proxy's: raise it there.
  int max_connections_per_client = 16;
  // See the file comment.
  absl::Duration request_timeout = absl::Seconds(10);
  absl::Duration idle_timeout = absl::Seconds(5);
  absl::Duration send_timeout = absl::Seconds(10);
  size_t max_header_bytes = 16 << 10;  // request line + headers
  size_t max_body_bytes = 8 << 20;
  // PEM files: both set -> HTTPS only; both empty -> plain HTTP.
  std::string tls_cert_file;
  std::string tls_key_file;
};

// Owns the listening socket, the connections and their threads.
class HttpServer {
 public:
  // Binds `host`:`port` (port 0: a free one; host a numeric address or a name, "0.0.0.0" for all
  // IPv4 interfaces) and starts serving `router`. INVALID_ARGUMENT naming the option for a bad
  // option (port out of range, a cap < 1, a non-positive timeout or limit, only one of the TLS
  // files, a TLS file OpenSSL cannot load: "tls-cert, tls-key: ..."); UNAVAILABLE naming the
  // address when it cannot be resolved or bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Create(const std::string& host, int port,
                                                            HttpServerOptions options,
                                                            HttpRouter router);
  ~HttpServer();  // Stop()s.
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // The bound port and address (as getsockname reports it: "0.0.0.0" when bound to all).
  int port() const { return port_; }
  const std::string& bound_address() const { return bound_address_; }
  bool tls() const { return ssl_ctx_ != nullptr; }
  // Open connections now (for tests and metrics).
  int open_connections() const;

  // Stops accepting, lets handlers in flight finish and write their response (bounded by
  // send_timeout), ends connections that are reading or idle at once, joins every thread.
  // Idempotent.
  void Stop();

 private:
  enum class Phase { kReading, kHandling, kWriting };
  struct Connection {
    uint64_t id = 0;
    int fd = -1;  // closed (and set to -1) under mu_, so the watchdog never touches a reused fd
    std::string client;
    std::thread thread;
    Phase phase = Phase::kReading;
    absl::Time deadline = absl::InfiniteFuture();
    bool timed_out = false;
    bool done = false;
  };
  class Stream;

  HttpServer(HttpServerOptions options, HttpRouter router);
  void AcceptLoop();
  void WatchdogLoop();
  void Serve(Connection* conn);
  // Serves requests on `stream` until the connection is to close.
  void ServeRequests(Connection* conn, Stream& stream);
  void SetPhase(Connection* conn, Phase phase, absl::Time deadline);
  bool TimedOut(Connection* conn);
  void Refuse(int fd, const std::string& why);
  void ReapFinished();

  const HttpServerOptions options_;
  const HttpRouter router_;
  SSL_CTX* ssl_ctx_ = nullptr;
  int listen_fd_ = -1;
  int wake_pipe_[2] = {-1, -1};
  int port_ = 0;
  std::string bound_address_;
  std::thread accept_thread_;
  std::thread watchdog_thread_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool watchdog_exit_ ABSL_GUARDED_BY(mu_) = false;  // set once every other thread is joined
  bool stopped_ = false;                             // owner thread only
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::unique_ptr<Connection>> connections_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> per_client_ ABSL_GUARDED_BY(mu_);
  int open_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint64_t> finished_ ABSL_GUARDED_BY(mu_);
};

}  // namespace switchyard

#endif  // SWITCHYARD_COMMON_HTTP_SERVER_H_
