// Highway SIMD attention over a packed cache or dense views (split over the
// sequence, threads over heads and splits); tested against ref::attend.
#pragma once

#include "core/attend_params.hpp"

namespace skvq::cpu {

void attend(const AttendParams& p);

}  // namespace skvq::cpu
