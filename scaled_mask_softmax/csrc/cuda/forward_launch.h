// The forward's launches for scores of type scalar_t (forward_ladder.cuh), one file of them a dtype.
#pragma once

#include <cuda_runtime.h>

#include "../binding.h"
#include "../params.h"

namespace sms {

template <typename scalar_t>
void launch_forward(const ForwardParams& p, MaskKind mask_kind, cudaStream_t stream);

}  // namespace sms
