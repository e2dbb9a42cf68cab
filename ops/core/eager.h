// Eager allreduces: small allreduces whose names are already agreed ride in the runtime's control
// message and finish in its one round, instead of a control round and then a data round.
//
// The eager region is the tail of the control message: entries in ascending id order, ended by
// a zero word (or the region's end). An entry is
//   [header: id + 1 | dtype << 32 | op << 40 | invalid << 63] [count] [data, zero-padded to words].
// Combining (one rank's region `in` into another's `inout`) keeps an entry of inout valid only
// when `in` holds a valid entry of the same id, dtype, op and count, and then reduces the data;
// entries of `in` that inout lacks are dropped. So after the allreduce every rank holds valid
// exactly the entries every rank contributed, each reduced over all of them.
#pragma once

#include <cstdint>
#include <vector>

#include "types.h"

namespace mlsl {

// Words one entry of `bytes` bytes of data takes (header and count included).
int64_t EagerEntryWords(int64_t bytes);

// Writes an entry's header at words[*at] when it fits before `end` (one word stays free for the
// end marker); returns where its data goes (EagerEntryWords(bytes) - 2 words, zeroed) and moves
// *at past it, or nullptr when it does not fit. Ids must be written in ascending order.
void* PutEager(uint64_t* words, int64_t end, int64_t* at, int32_t id, DataType dtype, ReduceOp op, int64_t count);

// inout = inout (combined with) in, over regions of `count` words.
void CombineEager(const uint64_t* in, uint64_t* inout, int64_t count);

struct EagerEntry {
  int32_t id;
  DataType dtype;
  ReduceOp op;
  int64_t count;
  const void* data;
};
// The valid entries of a combined region.
std::vector<EagerEntry> ValidEager(const uint64_t* words, int64_t count);

}  // namespace mlsl
