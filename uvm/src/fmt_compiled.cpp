// fmt's compiled part (its out-of-line functions: vformat, vprint, the float formatting),
// built once here. Debian's libfmt-dev ships fmt only as a shared library, and the shim must
// not depend on one (docs/install.md), so until now every translation unit used fmt as a
// header-only library (FMT_HEADER_ONLY): each compiled its own copy of all of fmt, which
// under the sanitizers took most of each file's compile time (size.cpp: 45 s with it, 4 s
// without, ASan+UBSan at -O1). Now only this file does; the others include fmt's headers
// without FMT_HEADER_ONLY and link these definitions from spillway_uvm.
//
// What is here follows fmt 9's own split between header and library: with FMT_FUNC empty,
// fmt/format-inl.h defines the non-inline functions that fmt/core.h and fmt/format.h
// declare FMT_API; the templates that fmt/format.h declares `extern template` (for char and
// wchar_t) and the float conversions (dragonbox::to_decimal) are instantiated explicitly.
#ifdef FMT_HEADER_ONLY
#error "fmt_compiled.cpp is fmt's compiled part: build it without FMT_HEADER_ONLY"
#endif
#include <fmt/format-inl.h>

FMT_BEGIN_NAMESPACE
namespace detail {
template FMT_API auto dragonbox::to_decimal(float x) noexcept -> dragonbox::decimal_fp<float>;
template FMT_API auto dragonbox::to_decimal(double x) noexcept -> dragonbox::decimal_fp<double>;
#ifndef FMT_STATIC_THOUSANDS_SEPARATOR
template FMT_API locale_ref::locale_ref(const std::locale& loc);
template FMT_API auto locale_ref::get<std::locale>() const -> std::locale;
#endif
template FMT_API auto thousands_sep_impl(locale_ref) -> thousands_sep_result<char>;
template FMT_API auto decimal_point_impl(locale_ref) -> char;
template FMT_API auto thousands_sep_impl(locale_ref) -> thousands_sep_result<wchar_t>;
template FMT_API auto decimal_point_impl(locale_ref) -> wchar_t;
}  // namespace detail
FMT_END_NAMESPACE
