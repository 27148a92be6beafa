// File: common/http_listener.cc
#include "common/http_listener.h"

#include <httplib.h>

#include <chrono>

namespace switchyard {

void HttpListener::Start(httplib::Server* server) {
  server_ = server;
  done_ = std::make_shared<std::atomic<bool>>(false);
  thread_ = std::thread([server, done = done_] {
    server->listen_after_bind();
    done->store(true);
  });
  while (!server->is_running() && !done_->load()) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void HttpListener::Stop() {
  if (server_ != nullptr) server_->stop();
  if (thread_.joinable()) thread_.join();
  server_ = nullptr;
}

}  // namespace switchyard
