// Running a call's work items on XLA's intra-op thread pool (ffi::ThreadPool).
//
// Items are claimed one at a time by the calling thread and by helpers scheduled on the pool:
// num_threads() - 1 of them, so that with the caller num_threads() threads work (one helper
// more oversubscribes the cores: a decode step's matmuls ran ~11% slower on 2 cores).
// The caller waits only for items already claimed, so a helper that starts late finds nothing
// left and never touches the call's buffers; the shared state (with the job) outlives the call
// for it. Each thread gets its own scratch buffer.
//
// It waits spinning first, then blocking: what is left when its own share is done is a
// helper's last item, and a caller asleep on a condition variable resumes only after the
// kernel wakes it, a delay added to every call (a decode step makes one per matmul and per
// attention, ~150 of them).
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace jaxvllm {

constexpr int kSpinPauses = 1 << 14;  // a few hundred microseconds of spinning at most

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

template <typename Job>  // void job(int64_t item, std::vector<float>& scratch)
void ParallelFor(xla::ffi::ThreadPool& pool, int64_t num_items, Job job) {
  if (num_items <= 0) return;
  struct State {
    Job job;
    int64_t num_items;
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
    std::mutex mu;
    std::condition_variable cv;
    State(Job j, int64_t n) : job(std::move(j)), num_items(n) {}
    void Work() {
      std::vector<float> scratch;
      int64_t finished = 0;
      for (int64_t i; (i = next.fetch_add(1)) < num_items; ++finished) job(i, scratch);
      if (finished == 0 || done.fetch_add(finished) + finished < num_items) return;
      std::lock_guard<std::mutex> lock(mu);  // the caller checks `done` holding it: no lost wake-up
      cv.notify_all();
    }
  };
  auto state = std::make_shared<State>(std::move(job), num_items);
  const int64_t helpers = std::min<int64_t>(pool.num_threads() - 1, num_items - 1);
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([state] { state->Work(); });
  state->Work();
  for (int spin = 0; spin < kSpinPauses && state->done.load() < num_items; ++spin) CpuRelax();
  std::unique_lock<std::mutex> lock(state->mu);
  state->cv.wait(lock, [&] { return state->done.load() == num_items; });
}

}  // namespace jaxvllm
