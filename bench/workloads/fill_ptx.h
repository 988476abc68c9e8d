// fill_u32(u32* p, u64 count, u32 value): p[i] = value for i < count, a grid-stride loop,
// in PTX for the real driver to JIT (spillway-oversubscribe, spillway-launch-check).
#pragma once

#include <string>

namespace spillway::bench {

// A PTX module's header for `target` (e.g. "sm_75"; PTX ISA 8.0, CUDA 12.0 and later).
inline std::string ptx_header(const char* target) {
  return std::string("\n.version 8.0\n.target ") + target + "\n.address_size 64\n";
}

// The grid-stride loop a fill kernel ends with: stores %r1 into the %rd2 words at %rd1.
inline constexpr const char* kFillLoop = R"(  cvta.to.global.u64 %rd3, %rd1;
  mov.u32 %r2, %ctaid.x;
  mov.u32 %r3, %ntid.x;
  mov.u32 %r4, %tid.x;
  mad.lo.u32 %r5, %r2, %r3, %r4;
  cvt.u64.u32 %rd4, %r5;
  mov.u32 %r6, %nctaid.x;
  mul.wide.u32 %rd5, %r6, %r3;
L1:
  setp.ge.u64 %p1, %rd4, %rd2;
  @%p1 bra L2;
  shl.b64 %rd6, %rd4, 2;
  add.s64 %rd7, %rd3, %rd6;
  st.global.u32 [%rd7], %r1;
  add.s64 %rd4, %rd4, %rd5;
  bra L1;
L2:
  ret;
}
)";

// fill_u32's entry, up to kFillLoop.
inline constexpr const char* kFillU32Entry = R"(.visible .entry fill_u32(.param .u64 fp0, .param .u64 fp1, .param .u32 fp2)
{
  .reg .pred %p<2>;
  .reg .b32 %r<8>;
  .reg .b64 %rd<10>;
  ld.param.u64 %rd1, [fp0];
  ld.param.u64 %rd2, [fp1];
  ld.param.u32 %r1, [fp2];
)";

// A module holding fill_u32 alone.
inline std::string fill_u32_module(const char* target) { return ptx_header(target) + kFillU32Entry + kFillLoop; }

}  // namespace spillway::bench
