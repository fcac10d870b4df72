// The HTTP layer (cpp-httplib): routes, API-key check, body limit, OpenAI response and SSE shapes.
// It binds and answers /health (503) before the model is loaded; attach() makes it serve requests.
// httplib stays inside http_server.cpp (its compile definitions must match the Debian library).
#pragma once
#include <cstddef>
#include <memory>
#include <string>

#include "server/auth.h"
#include "server/metrics.h"
#include "server/prepare.h"
#include "server/slots.h"

namespace kvzap {
class Engine;
class Model;
}  // namespace kvzap

namespace kvzap::server {

class Scheduler;

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  ApiKeys keys;
  size_t max_body_bytes = 8 << 20;
  std::string model_id;        // "model" in responses and /v1/models
  std::string slot_save_path;  // empty: /slots/* disabled; with API keys, one subfolder per key (slots.h)
  SlotQuota slot_quota;        // per key
  int threads = 16;            // HTTP worker threads (streams hold one each)
  int header_timeout_s = 10;   // a connection must send a whole header block within this (else closed)
  int max_conns_per_client = 1024;  // open connections per client address (beyond: 503 and close)
  bool log_requests = true;
};

class HttpServer {
 public:
  HttpServer(HttpOptions opt, Metrics& metrics);
  ~HttpServer();
  // Binds the port (false if it cannot).
  bool bind();
  // From now on requests are served (before: 503 "Loading model").
  void attach(const Model& model, Engine& engine, Scheduler& scheduler, const ServerDefaults& defaults);
  // Serves until stop().
  void listen();
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvzap::server
