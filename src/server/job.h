// One request as the scheduler sees it (Job), and the channel its HTTP thread reads events from.
// The HTTP thread creates both; the scheduler thread owns the Job once submitted and pushes events;
// either side may cancel (client gone / shutdown). The channel is the only thing both threads touch.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "press/press.h"
#include "server/api_error.h"

namespace kvzap::server {

using Clock = std::chrono::steady_clock;

struct KvUsage {
  std::string press = "none";
  double evicted_fraction = 0;
  int64_t kv_bytes = 0, kv_bytes_full = 0;
};

struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  KvUsage kv;
};

struct StreamEvent {
  enum class Kind { Text, Finish, Error };
  Kind kind = Kind::Text;
  std::string text;           // Text: a UTF-8-complete piece; Finish: the last piece (may be empty)
  std::string finish_reason;  // Finish: OpenAI's "stop" | "length"
  Usage usage;                // Finish
  std::optional<ApiError> error;  // Error
};

class RequestChannel {
 public:
  void push(StreamEvent e) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      events_.push_back(std::move(e));
    }
    cv_.notify_one();
  }
  // The next event, or nothing after `timeout`.
  std::optional<StreamEvent> pop(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return std::nullopt;
    StreamEvent e = std::move(events_.front());
    events_.pop_front();
    return e;
  }
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StreamEvent> events_;
  std::atomic<bool> cancelled_{false};
};

struct Job {
  std::string id;
  std::vector<int32_t> prompt;
  GenerationOptions gen;
  // Compression: none when !has_press. press_key names the settings (and tenant) for prefix reuse.
  bool has_press = false;
  PressSpec press_spec;
  std::unique_ptr<Press> first_press;  // made (and validated) by the HTTP thread; later admissions remake it
  std::string press_label = "none";
  std::string press_key;
  bool store_prefix = true;  // keep the compressed prompt for later requests when this one finishes
  std::string prefix_quota;  // its cache entry is charged here (PrefixCache quotas); empty = uncharged
  std::shared_ptr<RequestChannel> channel;
  Clock::time_point arrival = Clock::now(), deadline = Clock::time_point::max();

  // Progress kept across preemptions (recompute replays prompt + generated).
  std::vector<int32_t> generated;  // sampled tokens that were (or are about to be) fed
  int64_t completion_tokens = 0, cached_tokens = 0;
  int preemptions = 0;
  // KV pages the request held when it was last preempted: it is not admitted again before that much is
  // free, so it does not restart only to be preempted at the same point.
  int64_t pages_at_preemption = 0;
  bool admitted_once = false;
  Clock::time_point admitted{}, first_token{}, last_token{};
};

}  // namespace kvzap::server
