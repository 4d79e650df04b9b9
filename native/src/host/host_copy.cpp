// ParallelCopier and the codec slab plans (host_copy.h). Stripes are 64-byte aligned so two
// threads never write one cache line; the calling thread copies the last stripe itself.
#include "host/host_copy.h"

#include <algorithm>
#include <cstring>

namespace kvr {

ParallelCopier::ParallelCopier(int threads) {
  const int workers = std::max(1, threads) - 1;
  workers_.reserve(static_cast<size_t>(workers));
  for (int i = 0; i < workers; ++i) workers_.emplace_back([this, i] { work(static_cast<size_t>(i)); });
}

ParallelCopier::~ParallelCopier() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ParallelCopier::copy_stripe(size_t stripe, size_t stripes) {
  // Stripe bounds: n split evenly, rounded to 64 bytes; the last stripe takes the remainder.
  const size_t per = (n_ / stripes + 63) / 64 * 64;
  const size_t b = std::min(n_, stripe * per), e = stripe + 1 == stripes ? n_ : std::min(n_, b + per);
  if (e > b) std::memcpy(dst_ + b, src_ + b, e - b);
}

void ParallelCopier::work(size_t worker) {
  uint64_t seen = 0;
  for (;;) {
    size_t stripes;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      stripes = stripes_;
    }
    if (worker + 1 >= stripes) continue;  // not needed for this copy
    copy_stripe(worker, stripes);
    std::lock_guard<std::mutex> lock(mu_);
    if (--pending_ == 0) done_.notify_one();
  }
}

void ParallelCopier::copy(void* dst, const void* src, size_t n) {
  const size_t stripes = std::min<size_t>(static_cast<size_t>(threads()), n / kMinStripe);
  if (stripes < 2) {
    if (n > 0) std::memcpy(dst, src, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    dst_ = static_cast<uint8_t*>(dst);
    src_ = static_cast<const uint8_t*>(src);
    n_ = n;
    stripes_ = stripes;
    pending_ = stripes - 1;
    ++generation_;
  }
  wake_.notify_all();
  copy_stripe(stripes - 1, stripes);
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return pending_ == 0; });
}

size_t layers_per_slab(size_t layer_bytes, size_t slab_bytes) {
  return std::max<size_t>(1, slab_bytes / std::max<size_t>(1, layer_bytes));
}

std::vector<SlabPiece> export_slab_plan(size_t first, size_t layer_bytes, size_t layers, size_t slab_bytes) {
  std::vector<SlabPiece> out;
  const size_t per = layers_per_slab(layer_bytes, slab_bytes);
  int buf = 0;
  for (size_t l0 = 0; l0 < layers; l0 += per) {
    const size_t l1 = std::min(layers, l0 + per);
    for (size_t o = first + l0 * layer_bytes, end = first + l1 * layer_bytes; o < end; o += slab_bytes) {
      out.push_back({o, std::min(end, o + slab_bytes), buf, l1});
      buf ^= 1;
    }
  }
  return out;
}

std::vector<SlabPiece> import_slab_plan(size_t frame_len, size_t slab_bytes) {
  std::vector<SlabPiece> out;
  int buf = 0;
  for (size_t o = 0; o < frame_len; o += slab_bytes) {
    out.push_back({o, std::min(frame_len, o + slab_bytes), buf, 0});
    buf ^= 1;
  }
  return out;
}

}  // namespace kvr
