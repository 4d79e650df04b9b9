// The kvr_kv_pool handle's layout, internal to the library: the model and its backend's pool.
// Shared by batch.cpp (create/free, counts, paged sequences) and kv_share.cpp (block tables,
// adoption, references). Not public ABI.
#pragma once

#include <memory>

#include "core/backend.h"
#include "core/model.h"

struct kvr_kv_pool {
  std::shared_ptr<const kvr::Model> model;
  std::shared_ptr<kvr::PoolState> pool;
};
