// <cuda_fp16.h> for the host emulation (see cuda_emulation.h): IEEE half floats, rounded to
// nearest even as __float2half_rn rounds.
#pragma once

using __half = _Float16;

inline float __half2float(__half h) { return static_cast<float>(h); }
inline __half __float2half_rn(float f) { return static_cast<__half>(f); }
