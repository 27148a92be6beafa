// File: common/http_listener.h
//
// Runs a bound cpp-httplib server on its own thread so that it can always be stopped.
//
// httplib's Server::stop() only acts once listen_after_bind() has marked the server running on
// the listening thread (is_running()); a stop() that comes first does nothing, and the thread
// then blocks in accept() forever, so joining it hangs (seen: a coordinator test's server torn
// down right after it started, hung in ~CoordinatorServer). HttpListener::Start returns only when
// the server runs (or its listen loop has already ended), and Stop() stops and joins it.
//
// Usage: bind the server (bind_to_port / bind_to_any_port), then
//   HttpListener listener;
//   listener.Start(&server);   // the server must outlive the listener's Stop
//   ...
//   listener.Stop();           // idempotent; also run by the destructor
#ifndef SWITCHYARD_COMMON_HTTP_LISTENER_H_
#define SWITCHYARD_COMMON_HTTP_LISTENER_H_

#include <atomic>
#include <memory>
#include <thread>

namespace httplib {
class Server;
}

namespace switchyard {

class HttpListener {
 public:
  HttpListener() = default;
  HttpListener(const HttpListener&) = delete;
  HttpListener& operator=(const HttpListener&) = delete;
  ~HttpListener() { Stop(); }

  // Starts server->listen_after_bind() on a new thread; returns once the server is running or its
  // listen loop has returned (e.g. the socket was not bound). At most once per listener.
  void Start(httplib::Server* server);
  // Stops the server (if started) and joins the thread.
  void Stop();

 private:
  httplib::Server* server_ = nullptr;
  std::shared_ptr<std::atomic<bool>> done_;
  std::thread thread_;
};

}  // namespace switchyard

#endif  // SWITCHYARD_COMMON_HTTP_LISTENER_H_
