#!/usr/bin/env bash
# A local cluster with mutual TLS and tokens, set up from the command-line flags alone:
# certificates made here with openssl; the CLI and tessera-train get in with the CA, a
# certificate and the token, and are refused without them.
set -euo pipefail
source "$(dirname "$0")/local_cluster_kit.sh" "$1" "$2" 3
D="$TESSERA_CLUSTER_DIR/secrets"
mkdir -p "$D"
key="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
(
  cd "$D"
  openssl req -x509 $key -keyout ca.key -out ca.pem -days 2 -subj /CN=tessera-test-ca
  openssl req $key -keyout node.key -out node.csr -subj /CN=tessera-node
  echo "subjectAltName=IP:127.0.0.1,DNS:localhost" > node.ext
  openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
    -extfile node.ext -out node.pem
  openssl req -x509 $key -keyout other.key -out other.pem -days 2 -subj /CN=other-ca
  echo "full-$RANDOM$RANDOM" > token
  echo "read-$RANDOM$RANDOM" > read-only-token
) > "$D/openssl.log" 2>&1 || { cat "$D/openssl.log"; fail "openssl"; }

TLS="--tls_ca_file=$D/ca.pem --tls_cert_file=$D/node.pem --tls_key_file=$D/node.key"
export TESSERA_SERVER_FLAGS="$TLS --tls_require_client_cert --token_file=$D/token --read_only_token_file=$D/read-only-token"
export TESSERA_CLIENT_FLAGS="$TLS --token_file=$D/token"
"$CLUSTER" start 2 > /dev/null

CLI="$BIN/tessera-cli --coordinator=127.0.0.1:$base --deadline_ms=3000"
# shellcheck disable=SC2086
$CLI $TESSERA_CLIENT_FLAGS create --table=user --dim=4 > /dev/null || fail "create with TLS and token"
# shellcheck disable=SC2086
$CLI $TESSERA_CLIENT_FLAGS tables | grep -q "^user" || fail "table not listed"

expect_refused() {  # code, what, flags...
  local code="$1" what="$2"; shift 2
  local out
  if out="$($CLI "$@" tables 2>&1)"; then fail "$what: the call succeeded"; fi
  echo "$out" | grep -q "$code" || fail "$what: expected $code, got: $out"
}
expect_refused UNAVAILABLE "plaintext client"
# ... and says what to try.
out="$($CLI tables 2>&1 || true)"
echo "$out" | grep -q "pass --tls_ca_file" || fail "plaintext client: no hint at TLS in: $out"
# shellcheck disable=SC2086
expect_refused UNAVAILABLE "a CA that signed nothing here" --tls_ca_file="$D/other.pem" \
  --tls_cert_file="$D/node.pem" --tls_key_file="$D/node.key" --token_file="$D/token"
# shellcheck disable=SC2086
expect_refused UNAVAILABLE "no client certificate" --tls_ca_file="$D/ca.pem" --token_file="$D/token"
out="$($CLI --tls_ca_file="$D/ca.pem" --token_file="$D/token" tables 2>&1 || true)"
echo "$out" | grep -q "without a client certificate.*pass --tls_cert_file" \
  || fail "no client certificate: the hint must name it, got: $out"
echo "$out" | grep -q "is the server plaintext" && fail "no client certificate: hint blames plaintext"
# shellcheck disable=SC2086
expect_refused UNAUTHENTICATED "no token" $TLS
# Status without the client's TLS flags: the servers run, and it says why it cannot tell.
out="$(TESSERA_CLIENT_FLAGS= "$CLUSTER" status || true)"
[ "$(echo "$out" | grep -c "UNREACHABLE (running, .*set TESSERA_CLIENT_FLAGS")" = 3 ] \
  || fail "status without client flags must name TLS, got: $out"
echo "$out" | grep -q "DOWN" && fail "status called live servers DOWN: $out"
"$CLUSTER" status | grep -c SERVING | grep -qx 3 || fail "status with client flags"

# The read-only token looks up and lists, and cannot create.
RO="$TLS --token_file=$D/read-only-token"
# shellcheck disable=SC2086
$CLI $RO lookup --table=user --ids=1,2 | grep -q . || fail "read-only lookup"
# shellcheck disable=SC2086
out="$($CLI $RO create --table=other --dim=4 2>&1 || true)"
echo "$out" | grep -q PERMISSION_DENIED || fail "read-only create: expected PERMISSION_DENIED, got $out"
# shellcheck disable=SC2086
$CLI $TESSERA_CLIENT_FLAGS tables | grep -q "^other" && fail "the refused create left a table"

# Training through the secured cluster, smart client (straight to the shards) included.
# shellcheck disable=SC2086
"$BIN/tessera-train" --coordinator="127.0.0.1:$base" --client_mode=smart $TESSERA_CLIENT_FLAGS \
  --steps=20 --num_sparse=2 --batch_size=64 --held_out=500 --log_every=0 > "$D/train.log" 2>&1 \
  || { cat "$D/train.log"; fail "tessera-train over TLS"; }
grep -q "held-out" "$D/train.log" || fail "training did not finish"
# The Python client with the same credentials, and without the token.
PYTHONPATH="$BIN/python" /usr/bin/python3 - "127.0.0.1:$base" "$D" <<'PY' || fail "python client over TLS"
import sys, grpc, tessera
address, d = sys.argv[1], sys.argv[2]
read = lambda name: open(f"{d}/{name}", "rb").read()
tls = dict(root_certs=read("ca.pem"), cert_chain=read("node.pem"), private_key=read("node.key"))
client = tessera.connect(address, token=read("token").decode().strip(), **tls)
assert client.lookup("user", [1, 2, 3]).shape == (3, 4)
client.push("user", [1], [[0.5] * 4], step=1)
try:
    tessera.connect(address, **tls).lookup("user", [1])
    raise SystemExit("a call without the token succeeded")
except tessera.TesseraError as e:
    assert e.code == grpc.StatusCode.UNAUTHENTICATED, e
PY
echo "secure cluster: ok"
