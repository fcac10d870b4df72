// The server's scheduler without HTTP: jobs submitted straight to it on the default model. Every job ends
// under a budget too small for all of them at once (preempted ones are recomputed to the same greedy
// text as when run alone), --max-prefills bounds the prompts fed at once, and a prompt larger than the
// whole budget is refused at once instead of waiting forever.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "server/job.h"
#include "server/metrics.h"
#include "server/scheduler.h"
#include "test_support.h"

namespace {

using namespace kvzap;
using namespace kvzap::server;

struct Outcome {
  bool finished = false;
  std::string text, finish_reason;
  int status = 0;  // the ApiError status of an Error event
};

class SchedulerTest : public test::DefaultModelTest {
 protected:
  std::unique_ptr<Engine> engine(int64_t budget) {
    EngineOptions o;
    o.n_threads = 2;
    o.n_ctx = 512;
    o.n_batch = 64;
    o.kv_budget_bytes = budget;
    return std::make_unique<Engine>(*model_, o);
  }
  // A greedy job over `n` prompt tokens (distinct per `salt`) asking for `max_new` tokens.
  static std::unique_ptr<Job> job(int salt, int n, int max_new) {
    auto j = std::make_unique<Job>();
    j->id = "job-" + std::to_string(salt);
    for (int i = 0; i < n; i++) j->prompt.push_back(1 + (i * 31 + salt * 97) % 2000);
    j->gen.max_new_tokens = max_new;
    j->gen.sampling.temperature = 0;
    j->gen.stop_at_eog = false;
    j->channel = std::make_shared<RequestChannel>();
    return j;
  }
  // Reads a job's events to its end (at most `limit`).
  static Outcome wait(RequestChannel& ch, std::chrono::seconds limit = std::chrono::seconds(120)) {
    Outcome o;
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      auto e = ch.pop(std::chrono::milliseconds(100));
      if (!e) continue;
      o.text += e->text;
      if (e->kind == StreamEvent::Kind::Finish) {
        o.finished = true;
        o.finish_reason = e->finish_reason;
        return o;
      }
      if (e->kind == StreamEvent::Kind::Error) {
        o.status = e->error ? e->error->status() : -1;
        return o;
      }
    }
    return o;  // neither: the test fails on it
  }
  // Runs jobs through a scheduler (all submitted at once) and returns their outcomes in order; while
  // they run, samples the prefilling gauge into `max_prefilling`.
  std::vector<Outcome> run_all(Engine& e, SchedulerOptions so, std::vector<std::unique_ptr<Job>> jobs, Metrics& m,
                               int64_t* max_prefilling = nullptr) {
    so.log_requests = false;
    Scheduler s(e, so, m);
    std::thread loop([&] { s.run(); });
    std::vector<std::shared_ptr<RequestChannel>> channels;
    for (auto& j : jobs) {
      channels.push_back(j->channel);
      s.submit(std::move(j));
    }
    std::atomic<bool> done{false};
    std::thread sampler([&] {
      while (!done.load()) {
        if (max_prefilling) {
          std::lock_guard<std::mutex> lock(m.gauges_mu);
          *max_prefilling = std::max(*max_prefilling, m.num_requests_prefilling.load());
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    });
    std::vector<Outcome> out;
    for (auto& ch : channels) out.push_back(wait(*ch));
    done = true;
    sampler.join();
    s.stop();
    loop.join();
    return out;
  }
  int64_t bytes_per_token() {
    auto e = engine((int64_t)1 << 28);
    auto seq = e->new_sequence();
    std::vector<int32_t> ids(256, 7);
    e->feed(*seq, ids.data(), (int64_t)ids.size());
    return seq->cache().bytes_resident() / 256;
  }
};

TEST_F(SchedulerTest, EveryJobEndsUnderATightBudgetWithTheGreedyTextOfRunningAlone) {
  const int n_jobs = 6, prompt = 64, max_new = 32;
  // Alone: one job at a time with room to spare.
  std::vector<std::string> alone;
  {
    auto e = engine((int64_t)1 << 28);
    Metrics m;
    for (int i = 0; i < n_jobs; i++) {
      std::vector<std::unique_ptr<Job>> one;
      one.push_back(job(i, prompt, max_new));
      SchedulerOptions so;
      so.parallel = 1;
      const auto r = run_all(*e, so, std::move(one), m);
      ASSERT_TRUE(r[0].finished) << i;
      alone.push_back(r[0].text);
    }
  }
  // Together, under a budget for about two and a half whole requests: admission by pages, preemption, recompute.
  const int64_t budget = bytes_per_token() * (prompt + max_new) * 5 / 2;
  auto e = engine(budget);
  Metrics m;
  SchedulerOptions so;
  so.parallel = n_jobs;
  std::vector<std::unique_ptr<Job>> jobs;
  for (int i = 0; i < n_jobs; i++) jobs.push_back(job(i, prompt, max_new));
  const auto together = run_all(*e, so, std::move(jobs), m);
  for (int i = 0; i < n_jobs; i++) {
    ASSERT_TRUE(together[i].finished) << "job " << i << " did not finish (status " << together[i].status << ")";
    EXPECT_EQ(together[i].finish_reason, "length") << i;
    EXPECT_EQ(together[i].text, alone[i]) << "job " << i << ": batched greedy text differs from running alone";
  }
  EXPECT_GT(m.num_preemptions_total.load(), 0) << "the budget was meant to force preemptions";
  EXPECT_EQ(e->pages().pages_in_use(), 0);  // every page back once all ended
}

TEST_F(SchedulerTest, MaxPrefillsBoundsThePromptsFedAtOnce) {
  auto e = engine((int64_t)1 << 28);
  for (int max_prefills : {1, 2}) {
    Metrics m;
    SchedulerOptions so;
    so.parallel = 6;
    so.max_prefills = max_prefills;
    std::vector<std::unique_ptr<Job>> jobs;
    for (int i = 0; i < 6; i++) jobs.push_back(job(i, 160, 2));  // 160-token prompts: three steps each
    int64_t seen = 0;
    const auto r = run_all(*e, so, std::move(jobs), m, &seen);
    for (const Outcome& o : r) ASSERT_TRUE(o.finished);
    EXPECT_LE(seen, max_prefills);
    EXPECT_GE(seen, 1);
  }
}

TEST_F(SchedulerTest, APromptLargerThanTheWholeBudgetIsRefusedAtOnce) {
  const int64_t budget = bytes_per_token() * 64;  // 64 tokens of KV
  auto e = engine(budget);
  Metrics m;
  std::vector<std::unique_ptr<Job>> jobs;
  jobs.push_back(job(1, 400, 4));  // cannot fit, pruned or not (no press)
  jobs.push_back(job(2, 16, 4));   // fits: served after the refusal
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = run_all(*e, SchedulerOptions{}, std::move(jobs), m);
  EXPECT_FALSE(r[0].finished);
  EXPECT_EQ(r[0].status, 400);
  EXPECT_TRUE(r[1].finished);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
}

}  // namespace
