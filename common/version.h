// File: common/version.h
//
// The Switchyard release version, shared by every binary (`syctl version`, `switchyard-worker
// --self-check`, the coordinator's /version), plus cheap build facts known at compile time. No
// timestamps or commit hashes: they would change every build and defeat the shared disk cache.
#ifndef SWITCHYARD_COMMON_VERSION_H_
#define SWITCHYARD_COMMON_VERSION_H_

namespace switchyard {

// Semantic version of this source tree.
inline constexpr char kVersion[] = "0.1.0";

// Compiler that built the including translation unit ("gcc 12.2.0", "clang 16.0.6").
#if defined(__clang__)
inline constexpr char kBuildCompiler[] = "clang " __clang_version__;
#elif defined(__GNUC__)
inline constexpr char kBuildCompiler[] = "gcc " __VERSION__;
#else
inline constexpr char kBuildCompiler[] = "unknown compiler";
#endif

// "opt" when assertions are compiled out (NDEBUG), "dbg" otherwise.
#ifdef NDEBUG
inline constexpr char kBuildMode[] = "opt";
#else
inline constexpr char kBuildMode[] = "dbg";
#endif

}  // namespace switchyard

#endif  // SWITCHYARD_COMMON_VERSION_H_
