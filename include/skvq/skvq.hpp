// Umbrella header of the skvq library.
#pragma once

#include "skvq/attention.hpp"
#include "skvq/config.hpp"
#include "skvq/dtype.hpp"
#include "skvq/error.hpp"
#include "skvq/layer_cache.hpp"
#include "skvq/prompt_cache.hpp"
#include "skvq/tensor.hpp"
