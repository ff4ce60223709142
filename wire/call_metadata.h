#ifndef TESSERA_WIRE_CALL_METADATA_H_
#define TESSERA_WIRE_CALL_METADATA_H_

// The trailing metadata a shard puts on every answer, refusals included, for its callers.

namespace tessera::wire {

// The shard's incarnation (decimal): random at each start, so a caller sees a restart.
inline constexpr char kIncarnationMetadata[] = "tessera-incarnation";
// "disk" (it serves from a data directory, which a restart keeps) or "memory" (a restart
// empties it).
inline constexpr char kStorageMetadata[] = "tessera-storage";

}  // namespace tessera::wire

#endif  // TESSERA_WIRE_CALL_METADATA_H_
