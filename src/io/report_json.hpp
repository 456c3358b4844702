// JSON forms of a config, an accounting and stored bytes (report.json and
// the metadata of cache files use the same names as the spec).
#pragma once

#include <nlohmann/json.hpp>

#include "skvq/config.hpp"
#include "skvq/layer_cache.hpp"

namespace skvq::io {

nlohmann::json config_json(const Config& c);
nlohmann::json stored_bytes_json(const StoredBytes& b);
// Every property of spec section 6 under its spec name (perms as [H][D] lists or null).
nlohmann::json report_json(const SkvqCache& cache);

}  // namespace skvq::io
