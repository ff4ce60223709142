"""Fast paths for the two messages that carry bulk data.

Converting a repeated float field to NumPy through protobuf costs ~150 ns a value; the
wire bytes of a packed field are the little-endian float32 array itself. Lookups are
therefore answered as raw bytes and decoded here with np.frombuffer, and pushes append
the gradients' bytes to a protobuf-serialised header (serialised messages concatenate).
"""
import numpy as np

from tessera.v1 import embedding_service_pb2 as api


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(data: memoryview, pos: int):
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def decode_lookup_response(data: bytes):
    """(dim, values as a float32 array) from the bytes of a LookupResponse."""
    view = memoryview(data)
    pos, dim, parts = 0, 0, []
    while pos < len(view):
        tag, pos = _read_varint(view, pos)
        field, wire_type = tag >> 3, tag & 7
        if wire_type == 0:
            value, pos = _read_varint(view, pos)
            if field == 1:
                dim = value
        elif wire_type == 2:
            length, pos = _read_varint(view, pos)
            if field == 2:
                parts.append(np.frombuffer(view[pos:pos + length], dtype="<f4"))
            pos += length
        else:  # an unpacked float or anything else: let protobuf do it
            message = api.LookupResponse.FromString(data)
            return message.dim, np.asarray(message.values, dtype=np.float32)
    values = parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.zeros(0, np.float32)
    return dim, values


def encode_push_request(table: str, ids: np.ndarray, gradients: np.ndarray, step: int,
                        shard_map_version: int, request_id=None) -> bytes:
    """The bytes of a PushGradientsRequest; gradients (n, dim) float32; request_id a
    (client id, sequence) pair that makes repeats of the push apply once."""
    header = api.PushGradientsRequest(table=table, step=step, shard_map_version=shard_map_version)
    if request_id is not None:
        header.request_id.client_id, header.request_id.sequence = request_id
    header.ids.extend(ids.tolist())
    grads = np.ascontiguousarray(gradients, dtype="<f4").tobytes()
    return header.SerializeToString() + bytes([(3 << 3) | 2]) + _varint(len(grads)) + grads


def encode_lookup_request(table: str, ids: np.ndarray, shard_map_version: int = 0,
                          offsets=None, pooling: int = 0, weights=None,
                          read_only: bool = False) -> bytes:
    request = api.LookupRequest(table=table, pooling=pooling, shard_map_version=shard_map_version,
                                read_only=read_only)
    request.ids.extend(ids.tolist())
    if offsets is not None:
        request.offsets.extend(np.asarray(offsets, dtype=np.int64).tolist())
    if weights is not None:
        request.weights.extend(np.asarray(weights, dtype=np.float32).tolist())
    return request.SerializeToString()
