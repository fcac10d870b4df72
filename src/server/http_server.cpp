#include "server/http_server.h"

#include <httplib.h>

#include <strings.h>
#include <sys/socket.h>

#include <algorithm>
#include <set>

#include <atomic>
#include <cstdio>
#include <ctime>
#include <filesystem>

#include "engine/cache_file.h"
#include "engine/engine.h"
#include "model/model.h"
#include "server/api_error.h"
#include "server/request.h"
#include "server/responses.h"
#include "server/scheduler.h"

#include "server/http_conn.inc"

namespace kvzap::server {
namespace {

using nlohmann::json;

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump_json(body), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) { send_json(res, e.status(), e.body()); }

// An error answered before the body was read (or when it was read only in part): the connection must
// close, or the rest of the body would be parsed as the next request. httplib 0.11 closes a connection
// when a content provider fails, so the provider writes the whole answer and then reports failure.
void send_error_and_close(httplib::Response& res, const ApiError& e) {
  auto text = std::make_shared<std::string>(dump_json(e.body()));
  res.status = e.status();
  res.set_header("Connection", "close");
  res.set_content_provider(text->size(), "application/json", [text](size_t offset, size_t length, httplib::DataSink& sink) {
    sink.write(text->data() + offset, std::min(length, text->size() - offset));
    return false;
  });
}

bool closing(const httplib::Response& res) { return res.get_header_value("Connection") == "close"; }

bool iequals(const std::string& a, const char* b) { return strcasecmp(a.c_str(), b) == 0; }

}  // namespace

struct HttpServer::Impl {
  HttpOptions opt;
  Metrics& metrics;
  GatedServer http;
  std::atomic<bool> ready{false};
  const Model* model = nullptr;
  Engine* engine = nullptr;
  Scheduler* scheduler = nullptr;
  ServerDefaults defaults;
  std::unique_ptr<PressFactory> presses;
  std::atomic<uint64_t> next_id{1};
  std::atomic<int> in_flight{0};  // handlers running + streams still writing (stop() lets them finish)
  std::time_t started = std::time(nullptr);

  Impl(HttpOptions o, Metrics& m) : opt(std::move(o)), metrics(m) {}

  void log(const httplib::Request& req, int status, const std::string& what) {
    if (opt.log_requests) std::fprintf(stderr, "[serve] %s %s -> %d %s\n", req.method.c_str(), req.path.c_str(), status, what.c_str());
  }

  int tenant_of(const httplib::Request& req) const {
    if (!opt.keys.enabled()) return 0;
    return opt.keys.match(ApiKeys::from_headers(req.get_header_value("Authorization"), req.get_header_value("X-Api-Key")));
  }

  std::string new_id(const char* prefix) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%llx%06llx", prefix, (unsigned long long)started, (unsigned long long)next_id++);
    return buf;
  }

  using BodyHandler = std::function<void(const httplib::Request&, const std::string& body, httplib::Response&)>;

  void fail(const httplib::Request& req, httplib::Response& res, const ApiError& e, bool close) {
    metrics.requests_rejected_total++;
    log(req, e.status(), e.type() + ": " + e.what());
    if (close) send_error_and_close(res, e);
    else send_error(res, e);
  }

  // Runs on the headers, before httplib reads any body byte: authentication, the declared size, the
  // framing. A request refused here with a body still unread is answered and its connection closed.
  httplib::Server::HandlerResponse screen(const httplib::Request& req, httplib::Response& res) {
    const bool chunked = req.has_header("Transfer-Encoding");
    const bool sized = req.has_header("Content-Length");
    const std::string length = req.get_header_value("Content-Length");
    bool has_body = chunked || (sized && length != "0");
    auto refuse = [&](const ApiError& e) {
      fail(req, res, e, has_body);
      return httplib::Server::HandlerResponse::Handled;
    };
    if (chunked && !iequals(req.get_header_value("Transfer-Encoding"), "chunked"))
      return refuse(ApiError(501, "invalid_request_error", "only the 'chunked' transfer coding is supported"));
    if (chunked && sized) return refuse(invalid_request("a request may not have both Transfer-Encoding and Content-Length"));
    if (sized && (length.empty() || length.size() > 19 || length.find_first_not_of("0123456789") != std::string::npos)) {
      has_body = true;  // unknown length: the connection cannot be reused
      return refuse(invalid_request("malformed Content-Length"));
    }
    const bool health = req.path == "/health" || req.path == "/v1/health";
    const bool post_route = req.method == "POST" && post_paths.count(req.path);
    if (has_body && !post_route) return refuse(ApiError(404, "not_found_error", "no route " + req.method + " " + req.path + " takes a body"));
    if (post_route && !chunked && !sized) {
      // httplib would read such a body until the client closes; RFC 9112 asks for a length.
      has_body = true;
      return refuse(ApiError(411, "invalid_request_error", "a POST body needs Content-Length or Transfer-Encoding: chunked"));
    }
    if (health) return httplib::Server::HandlerResponse::Unhandled;
    if (opt.keys.enabled() && tenant_of(req) < 0)
      return refuse(ApiError(401, "authentication_error", "Invalid API Key: send it as 'Authorization: Bearer KEY' or 'X-Api-Key: KEY'"));
    if (!ready.load()) return refuse(unavailable("Loading model"));
    if (sized && std::stoull(req.get_header_value("Content-Length")) > opt.max_body_bytes) return refuse(too_large());
    if (req.get_header_value("Content-Type").rfind("multipart/", 0) == 0)
      return refuse(ApiError(415, "invalid_request_error", "multipart bodies are not supported: send JSON"));
    return httplib::Server::HandlerResponse::Unhandled;
  }

  ApiError too_large() const {
    return ApiError(413, "invalid_request_error", "the request body is larger than the limit of " + std::to_string(opt.max_body_bytes) + " bytes");
  }

  // Reads the body (any framing) up to --max-body, then runs the handler: ApiError -> its status and body;
  // anything else -> 500. The server stays up.
  httplib::Server::HandlerWithContentReader guarded_body(BodyHandler fn) {
    return [this, fn](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
      in_flight++;
      struct Done {
        std::atomic<int>& n;
        ~Done() { n--; }
      } done{in_flight};
      std::string body;
      bool over = false;
      const bool whole = reader([&](const char* data, size_t n) {
        if (body.size() + n > opt.max_body_bytes) {
          over = true;
          return false;
        }
        body.append(data, n);
        return true;
      });
      if (over) return fail(req, res, too_large(), true);
      if (!whole) return fail(req, res, invalid_request("the request body could not be read"), true);
      run(req, res, [&] { fn(req, body, res); });
    };
  }

  // Wraps a handler without a body (GET routes).
  httplib::Server::Handler guarded(std::function<void(const httplib::Request&, httplib::Response&)> fn) {
    return [this, fn](const httplib::Request& req, httplib::Response& res) {
      in_flight++;
      struct Done {
        std::atomic<int>& n;
        ~Done() { n--; }
      } done{in_flight};
      run(req, res, [&] { fn(req, res); });
    };
  }

  void run(const httplib::Request& req, httplib::Response& res, const std::function<void()>& fn) {
    try {
      if (!ready.load()) throw unavailable("Loading model");  // also checked in screen(); kept for safety
      if (opt.keys.enabled() && tenant_of(req) < 0)
        throw ApiError(401, "authentication_error", "Invalid API Key: send it as 'Authorization: Bearer KEY' or 'X-Api-Key: KEY'");
      fn();
    } catch (const ApiError& e) {
      fail(req, res, e, false);
    } catch (const std::exception& e) {
      log(req, 500, e.what());
      send_error(res, ApiError(500, "server_error", "internal error"));
    }
  }

  std::set<std::string> post_paths;

  void routes();
  void completion(const httplib::Request& req, const std::string& body, httplib::Response& res, Endpoint ep);
  void slots_save(const httplib::Request& req, const std::string& body, httplib::Response& res);
  void slots_restore(const httplib::Request& req, const std::string& body, httplib::Response& res);
  void post(const std::string& path, BodyHandler fn) {
    post_paths.insert(path);
    http.Post(path, guarded_body(std::move(fn)));
  }
  // The caller's slot file: under the caller's own folder (one per API key).
  std::string slot_path(const httplib::Request& req, const json& body) const {
    if (opt.slot_save_path.empty())
      throw ApiError(501, "not_supported_error", "slot saving is disabled: start the server with --slot-save-path DIR");
    const std::string key =
        opt.keys.enabled() ? ApiKeys::from_headers(req.get_header_value("Authorization"), req.get_header_value("X-Api-Key")) : "";
    return (std::filesystem::path(slot_folder(opt.slot_save_path, key)) / parse_slot_filename(body)).string();
  }
};

void HttpServer::Impl::completion(const httplib::Request& req, const std::string& text, httplib::Response& res, Endpoint ep) {
  const json body = parse_body(text);
  const CompletionRequest r = ep == Endpoint::Chat ? parse_chat_request(body, defaults.limits) : parse_completion_request(body, defaults.limits);
  const std::string id = new_id(ep == Endpoint::Chat ? "chatcmpl-" : "cmpl-");
  std::unique_ptr<Job> job = prepare_job(r, *model, engine->n_ctx(), defaults, *presses, tenant_of(req), id);
  auto channel = job->channel;
  const double timeout_s = defaults.request_timeout_s;
  scheduler->submit(std::move(job));

  auto shape = std::make_shared<ResponseShape>(ResponseShape{ep, id, (int64_t)std::time(nullptr), opt.model_id, r.include_usage});
  if (!r.stream) {
    std::string text;
    auto next_check = Clock::now();
    const auto give_up = Clock::now() + std::chrono::seconds((int64_t)(timeout_s > 0 ? timeout_s : 86400) + 60);
    for (;;) {
      auto ev = channel->pop(std::chrono::milliseconds(250));
      if (Clock::now() >= next_check) {  // tokens keep coming while generating: checked by time, not on idle
        next_check = Clock::now() + std::chrono::milliseconds(250);
        if (client_gone()) {  // nobody will read the answer: the scheduler drops the job and its pages
          channel->cancel();
          throw invalid_request("the client closed the connection");
        }
      }
      if (!ev) {
        if (Clock::now() > give_up) {
          channel->cancel();
          throw ApiError(500, "server_error", "the request did not finish in time");
        }
        continue;
      }
      if (ev->kind == StreamEvent::Kind::Error) throw *ev->error;
      text += ev->text;
      if (ev->kind == StreamEvent::Kind::Finish) {
        send_json(res, 200, full_response(*shape, text, ev->finish_reason, ev->usage));
        return;
      }
    }
  }

  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  auto finished = std::make_shared<std::atomic<bool>>(false);
  in_flight++;  // until the stream's last frame is written (the releaser)
  auto sent_role = std::make_shared<bool>(false);
  res.set_chunked_content_provider(
      "text/event-stream",
      [shape, channel, finished, sent_role](size_t, httplib::DataSink& sink) {
        auto write = [&](const std::string& frame) {
          if (sink.write(frame.data(), frame.size())) return true;
          channel->cancel();  // the client is gone: the scheduler drops the sequence and frees its pages
          return false;
        };
        if (!*sent_role) {
          *sent_role = true;
          if (shape->endpoint == Endpoint::Chat && !write(sse_frame(role_chunk(*shape)))) return false;
        }
        for (;;) {
          auto ev = channel->pop(std::chrono::milliseconds(1000));
          if (!ev) {
            if (!write(": ping\n\n")) return false;  // also how a silent dead peer is noticed
            continue;
          }
          if (ev->kind == StreamEvent::Kind::Error) {
            *finished = true;
            write(sse_frame(ev->error->body()));
            sink.done();
            return true;
          }
          if (ev->kind == StreamEvent::Kind::Text) return write(sse_frame(text_chunk(*shape, ev->text, nullptr)));
          std::string out;
          if (!ev->text.empty()) out += sse_frame(text_chunk(*shape, ev->text, nullptr));
          out += sse_frame(text_chunk(*shape, "", ev->finish_reason));
          if (shape->include_usage) out += sse_frame(usage_chunk(*shape, ev->usage));
          out += "data: [DONE]\n\n";
          *finished = true;
          if (!write(out)) return false;
          sink.done();
          return true;
        }
      },
      [this, channel, finished](bool) {
        if (!*finished) channel->cancel();
        in_flight--;
      });
}

void HttpServer::Impl::slots_save(const httplib::Request& req, const std::string& text, httplib::Response& res) {
  json body = parse_body(text);
  const std::string path = slot_path(req, body);
  const std::string folder = std::filesystem::path(path).parent_path().string();
  const std::string name = std::filesystem::path(path).filename().string();
  check_slot_quota(folder, name, 0, opt.slot_quota);  // the file count, before any work
  body.erase("filename");
  body["max_tokens"] = 1;
  body["stream"] = false;
  const bool chat = body.is_object() && body.contains("messages");
  const CompletionRequest r = chat ? parse_chat_request(body, defaults.limits) : parse_completion_request(body, defaults.limits);
  const std::string id = new_id("save-");
  std::unique_ptr<Job> job = prepare_job(r, *model, engine->n_ctx(), defaults, *presses, tenant_of(req), id);
  job->store_prefix = true;  // the file is written from the cache entry, whatever the press settings
  job->prefix_quota.clear();  // and it is a slot the key asked for (slots have their own quotas)
  const std::string key = job->press_key;
  const std::string settings = press_settings_key(job->has_press, job->press_spec);
  const std::vector<int32_t> prompt = job->prompt;
  auto channel = job->channel;
  scheduler->submit(std::move(job));
  for (;;) {  // the prompt is compressed (or found) by a one-token request, which caches it
    auto ev = channel->pop(std::chrono::milliseconds(500));
    if (!ev) continue;
    if (ev->kind == StreamEvent::Kind::Error) throw *ev->error;
    if (ev->kind == StreamEvent::Kind::Finish) break;
  }
  json out;
  scheduler->run_on_loop([&] {
    PrefixCache::Entry* e = scheduler->prefix_cache().find_exact(key, prompt);
    if (!e) throw invalid_request("the compressed prompt could not be kept (prefix cache disabled or too small: --prefix-cache)");
    CacheFileMeta meta;
    meta.press = settings;
    meta.tokens = prompt;
    meta.logits.assign(e->seq->logits(), e->seq->logits() + model->config().n_vocab);
    // Written under a hidden name, checked against the key's byte quota, then renamed over `path` (on
    // the loop thread, so saves never race each other's quota check).
    const std::string tmp = (std::filesystem::path(folder) / ("." + name + ".saving")).string();
    try {
      std::filesystem::create_directories(folder);
      save_cache_file(tmp, *model, e->seq->cache(), meta);
      check_slot_quota(folder, name, (int64_t)std::filesystem::file_size(tmp), opt.slot_quota);
      std::filesystem::rename(tmp, path);
    } catch (const ApiError&) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      throw;
    } catch (const std::exception& err) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      log(req, 500, err.what());  // the full message, with the server's folder, only in the log
      throw ApiError(500, "server_error", "the slot file '" + name + "' could not be written");
    }
    const KvCache& c = e->seq->cache();
    out = {{"filename", std::filesystem::path(path).filename().string()}, {"n_tokens", prompt.size()},
           {"n_bytes", std::filesystem::file_size(path)}, {"kv_bytes", c.bytes_resident()}, {"kv_bytes_full", c.bytes_full()},
           {"evicted_fraction", c.evicted_fraction()}, {"press", settings}};
  });
  log(req, 200, "saved " + path);
  send_json(res, 200, out);
}

void HttpServer::Impl::slots_restore(const httplib::Request& req, const std::string& text, httplib::Response& res) {
  const json body = parse_body(text);
  const std::string path = slot_path(req, body);
  if (!std::filesystem::is_regular_file(path)) throw ApiError(404, "not_found_error", "no slot file named '" + std::filesystem::path(path).filename().string() + "'");
  const int tenant = tenant_of(req);
  json out;
  scheduler->run_on_loop([&] {
    std::unique_ptr<Sequence> seq = engine->new_sequence();
    CacheFileMeta meta;
    try {
      meta = load_cache_file(path, *model, seq->cache());
    } catch (const KvBudgetExceeded& e) {
      throw unavailable(e.what());
    } catch (const Error& e) {
      std::string m = e.what();  // "<path>: problem" -> "<file name>: problem" (the server's folder stays private)
      if (m.rfind(path, 0) == 0) m = std::filesystem::path(path).filename().string() + m.substr(path.size());
      throw invalid_request(m);
    }
    if ((int64_t)meta.tokens.size() >= engine->n_ctx())
      throw invalid_request("the saved context (" + std::to_string(meta.tokens.size()) + " tokens) does not fit the server's context of " +
                            std::to_string(engine->n_ctx()) + " tokens");
    if (meta.logits.size() == (size_t)model->config().n_vocab) std::copy(meta.logits.begin(), meta.logits.end(), seq->mutable_logits());
    const KvCache& c = seq->cache();
    out = {{"filename", std::filesystem::path(path).filename().string()}, {"n_tokens", meta.tokens.size()}, {"press", meta.press},
           {"kv_bytes", c.bytes_resident()}, {"kv_bytes_full", c.bytes_full()}, {"evicted_fraction", c.evicted_fraction()}};
    if (!scheduler->prefix_cache().insert(meta.press + "|tenant=" + std::to_string(tenant), meta.tokens, std::move(seq)))
      throw invalid_request("the saved context is larger than the prefix cache budget (--prefix-cache)");
  });
  log(req, 200, "restored " + path);
  send_json(res, 200, out);
}

void HttpServer::Impl::routes() {
  http.set_payload_max_length(opt.max_body_bytes);
  http.set_read_timeout(10);
  http.set_write_timeout(30);
  // httplib's own workers only hand each new connection to the gate (http_conn.inc); the gate's
  // workers (opt.threads) serve the requests.
  http.new_task_queue = [] { return new httplib::ThreadPool(2); };

  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) { return screen(req, res); });
  // httplib answers "Expect: 100-continue" before routing: the same screen decides, so a refused
  // client is told (and the connection closed) before it sends the body.
  http.set_expect_100_continue_handler([this](const httplib::Request& req, httplib::Response& res) {
    return screen(req, res) == httplib::Server::HandlerResponse::Handled ? res.status : 100;
  });
  http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty() || closing(res)) return;
    if (res.status == 413) {
      log(req, 413, "body too large");
      send_error(res, too_large());
    } else if (res.status == 404) {
      send_error(res, ApiError(404, "not_found_error", "no route " + req.method + " " + req.path));
    } else {
      send_error(res, ApiError(res.status, "invalid_request_error", "the request could not be handled (HTTP " + std::to_string(res.status) + ")"));
    }
  });
  http.set_exception_handler([this](const httplib::Request& req, httplib::Response& res, std::exception_ptr) {
    log(req, 500, "unhandled exception");
    send_error(res, ApiError(500, "server_error", "internal error"));
  });

  auto health = [this](const httplib::Request&, httplib::Response& res) {
    if (!ready.load()) return send_error(res, unavailable("Loading model"));
    send_json(res, 200, {{"status", "ok"}});
  };
  http.Get("/health", health);
  http.Get("/v1/health", health);

  auto models = guarded([this](const httplib::Request&, httplib::Response& res) {
    const ModelConfig& c = model->config();
    json m = {{"id", opt.model_id}, {"object", "model"}, {"created", (int64_t)started}, {"owned_by", "kvzap"},
              {"meta", {{"arch", c.arch}, {"n_ctx", engine->n_ctx()}, {"n_ctx_train", c.n_ctx_train}, {"n_vocab", c.n_vocab},
                        {"n_layer", c.n_layer}, {"n_head_kv", c.n_head_kv}, {"kv_budget_bytes", engine->pages().budget_bytes()},
                        {"kv_type", kv_type_name(engine->kv_type())}}}};
    send_json(res, 200, {{"object", "list"}, {"data", json::array({m})}});
  });
  http.Get("/v1/models", models);
  http.Get("/models", models);

  http.Get("/metrics", guarded([this](const httplib::Request&, httplib::Response& res) {
    res.status = 200;
    res.set_content(metrics.render(), "text/plain; version=0.0.4");
  }));

  auto chat = [this](const httplib::Request& req, const std::string& body, httplib::Response& res) { completion(req, body, res, Endpoint::Chat); };
  auto cmpl = [this](const httplib::Request& req, const std::string& body, httplib::Response& res) { completion(req, body, res, Endpoint::Completion); };
  post("/v1/chat/completions", chat);
  post("/chat/completions", chat);
  post("/v1/completions", cmpl);
  post("/completions", cmpl);

  post("/tokenize", [this](const httplib::Request& req, const std::string& body, httplib::Response& res) {
    const TokenizeRequest t = parse_tokenize_request(parse_body(body));
    const Tokenizer& tok = model->tokenizer();
    std::vector<int32_t> ids;
    try {
      ids = tok.encode(t.content, t.add_special && tok.vocab().add_bos, t.parse_special);
    } catch (const Error& e) {
      throw invalid_request(e.what());
    }
    json out = json::array();
    for (int32_t id : ids) {
      if (!t.with_pieces) {
        out.push_back(id);
        continue;
      }
      const std::string piece = tok.token_bytes(id);
      if (is_valid_utf8(piece)) out.push_back({{"id", id}, {"piece", piece}});
      else out.push_back({{"id", id}, {"piece", std::vector<uint8_t>(piece.begin(), piece.end())}});
    }
    send_json(res, 200, {{"tokens", out}});
  });
  post("/detokenize", [this](const httplib::Request&, const std::string& body, httplib::Response& res) {
    const std::vector<int32_t> ids = parse_detokenize_request(parse_body(body), model->config().n_vocab);
    send_json(res, 200, {{"content", model->tokenizer().decode(ids)}});
  });
  post("/slots/save", [this](const httplib::Request& req, const std::string& body, httplib::Response& res) { slots_save(req, body, res); });
  post("/slots/restore", [this](const httplib::Request& req, const std::string& body, httplib::Response& res) { slots_restore(req, body, res); });
}

HttpServer::HttpServer(HttpOptions opt, Metrics& metrics) : impl_(std::make_unique<Impl>(std::move(opt), metrics)) { impl_->routes(); }
HttpServer::~HttpServer() = default;

bool HttpServer::bind() {
  // cpp-httplib 0.11 listens with a backlog of 5 (a compile-time constant of the packaged library): a
  // burst of clients overflows it and some connections are reset. The listening socket is caught here
  // and listen() is called again with a real backlog (Linux adjusts the backlog of a listening socket).
  int listen_fd = -1;
  impl_->http.set_socket_options([&listen_fd](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_fd = (int)sock;
  });
  const bool ok = impl_->http.bind_to_port(impl_->opt.host, impl_->opt.port);
  impl_->http.set_socket_options(httplib::default_socket_options);  // the lambda's capture dies here
  if (!ok) return false;
  if (listen_fd >= 0) ::listen(listen_fd, 1024);
  return true;
}

void HttpServer::attach(const Model& model, Engine& engine, Scheduler& scheduler, const ServerDefaults& defaults) {
  impl_->model = &model;
  impl_->engine = &engine;
  impl_->scheduler = &scheduler;
  impl_->defaults = defaults;
  impl_->presses = std::make_unique<PressFactory>(model);
  scheduler.prefix_cache().set_entry_overhead((int64_t)model.config().n_vocab * (int64_t)sizeof(float));  // logits
  impl_->ready = true;
}

void HttpServer::listen() {
  GateLimits g;
  g.header_timeout = std::chrono::seconds(impl_->opt.header_timeout_s);
  g.max_per_client = impl_->opt.max_conns_per_client;
  g.max_body = impl_->opt.max_body_bytes;
  // Large and chunked bodies are read by the gate only for requests the screen would let through (key,
  // size and route from the raw headers), so an unauthenticated client cannot make the server buffer anything.
  Impl* impl = impl_.get();
  impl_->http.start_gate(g, (size_t)impl_->opt.threads, &impl_->metrics, [impl](std::string_view head, uint64_t length) {
    if (length == kChunkedBody) {
      // "POST /path[?query] HTTP/1.1": only a route that takes a body has its chunked body read.
      if (head.substr(0, 5) != "POST ") return false;
      const std::string_view target = head.substr(5, head.find(' ', 5) - 5);
      if (!impl->post_paths.count(std::string(target.substr(0, target.find('?'))))) return false;
    } else if (length > impl->opt.max_body_bytes) {
      return false;
    }
    if (!impl->opt.keys.enabled()) return true;
    const std::string auth(GatedServer::header_value(head, "authorization")), key(GatedServer::header_value(head, "x-api-key"));
    return impl->opt.keys.match(ApiKeys::from_headers(auth, key)) >= 0;
  });
  impl_->http.listen_after_bind();
}
void HttpServer::stop() {
  // Streams write their last frame (finish or "shutting down") before httplib stops writing them.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (impl_->in_flight.load() > 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  impl_->http.stop();
  impl_->http.stop_gate();
}

}  // namespace kvzap::server
