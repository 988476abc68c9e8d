// Heap bytes a container holds, for the shim's state budget (SPILLWAY_STATE_MEMORY).
// Estimates from sizes and capacities, O(1) each, modelled on libstdc++'s node layouts
// (bits/hashtable_policy.h: a node is a next pointer and the value, plus the hash when the
// hash function is not "fast"; bits/stl_tree.h: colour, parent, left, right and the value)
// and glibc malloc's chunks (malloc/malloc.c: an 8-byte size header, 16-byte alignment,
// 32 bytes at least). The tests check the sum against the real heap (mallinfo2).
#pragma once

#include <cstdint>
#include <utility>

namespace spillway {

// What malloc takes for a request of `bytes`.
inline constexpr std::uint64_t heap_block_bytes(std::uint64_t bytes) {
  const std::uint64_t b = (bytes + 8 + 15) / 16 * 16;
  return b < 32 ? 32 : b;
}

// std::vector (or anything with capacity() and value_type): its storage.
template <class Vector>
std::uint64_t vector_heap_bytes(const Vector& v) {
  return v.capacity() == 0 ? 0 : heap_block_bytes(v.capacity() * sizeof(typename Vector::value_type));
}

// std::unordered_map / unordered_set: nodes (value, next pointer and a cached hash, counted
// whether or not the hash is cached) and the bucket array.
template <class Hash>
std::uint64_t hash_heap_bytes(const Hash& h) {
  return h.size() * heap_block_bytes(sizeof(typename Hash::value_type) + 2 * sizeof(void*)) +
         (h.bucket_count() > 1 ? heap_block_bytes(h.bucket_count() * sizeof(void*)) : 0);
}

// std::map / std::set with `nodes` nodes (size(), plus extracted nodes kept for reuse).
template <class Tree>
std::uint64_t tree_heap_bytes(std::uint64_t nodes) {
  return nodes * heap_block_bytes(sizeof(typename Tree::value_type) + 4 * sizeof(void*));
}

}  // namespace spillway
